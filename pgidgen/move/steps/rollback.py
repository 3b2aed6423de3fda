"""rollback: a move not yet past activate undone; the source serves the shard as before, nothing left on the target."""
from __future__ import annotations

from ...db import execute_script
from ...errors import DatabaseError
from .. import sqltext as q
from ..context import MoveError
from .base import MoverBase, MoveReport
from .replication import drop_slots, teardown


class RollbackStep(MoverBase):
    def rollback(self) -> MoveReport:
        shard = self.ctx.shard
        try:
            try:
                rows = self._target_rows()
            except DatabaseError as e:  # the target does not answer (its server gone for good?)
                self._rollback_source_only(e)
                return self.report
            if any(st == "active" for st, _ in rows.values()):
                raise MoveError(
                    f"the move of {self.what} is past its flip: {self.ctx.target} serves {'the shard' if len(self.ctxs) == 1 else 'them'} and may have taken writes",
                    hint=f"finish it with 'pgidgen move-shard --resume {shard}'; to go back, move {'the shard' if len(self.ctxs) == 1 else 'them'} again afterwards",
                )
            self.journal.log(self.rec.step, "rollback", {})
            teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))
            self._put_back_on_source()  # once no publication holds the tables
            self._point("rollback:torn-down")
            if any(st == "incoming" for st, _ in rows.values()):
                with self.tgt.transaction():
                    self._drop_target_copy()
            src_rows = {int(r[0]): (r[1], r[2]) for r in self.admin.execute(
                "SELECT shard, state, schema_name FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}
            parents = q.partitioned_of(self.admin, [st[1] for st in src_rows.values() if st[0] == "retired"])
            with self.admin.transaction():
                for c in self.ctxs:
                    st = src_rows.get(c.shard)
                    if st is not None and st[0] == "retired":
                        execute_script(self.admin, q.unretire_sql(c.shard, c.schema, st[1], [t.name for t in c.tables] + parents[st[1]]))
                self.admin.execute("UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = ANY(%s) AND state = 'moving'", (self.shards,))
            self.journal.finish("rolled_back")
        finally:
            self._close()
        self.report.status = "rolled_back"
        return self.report

    def _rollback_source_only(self, unreachable: DatabaseError) -> None:
        """The target does not answer: undo what the source holds (its slot keeps WAL, and the disk fills, for as
        long as the move stays open) when the source's own rows show the flip has not happened: a shard still
        `moving` there was never retired, so the target never activated it (activate follows the retire). What
        the target holds, its subscription and its copy, stays there, named, for when it is back."""
        src_rows = {int(r[0]): r[1] for r in self.admin.execute("SELECT shard, state FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}
        if any(st == "retired" for st in src_rows.values()):
            raise MoveError(
                f"{self.ctx.target} does not answer, and {self.what} {'is' if len(self.ctxs) == 1 else 'are'} retired on {self.ctx.source} already:"
                f" the flip may have activated {'it' if len(self.ctxs) == 1 else 'them'} there",
                hint=f"bring {self.ctx.target} back, then run 'pgidgen move-shard {self.ctx.shard} --resume' (or --rollback) again",
            ) from None
        self.journal.log(self.rec.step, "rollback", {"target_unreachable": unreachable.render()})
        drop_slots(self.admin, self.names, self.rec.detail.get("subscription_oid"))
        execute_script(self.admin, q.drop_publication_sql(self.names))
        self._put_back_on_source()
        self._point("rollback:torn-down")
        with self.admin.transaction():
            self.admin.execute("UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = ANY(%s) AND state = 'moving'", (self.shards,))
        self.journal.finish("rolled_back")
        schemas = ", ".join(c.schema for c in self.ctxs)
        self.report.left_on_target = f"its subscription {self.names.subscription} and its copy ({schemas}, if the copy had begun)"
        self.report.notes.append(
            f"when {self.ctx.target} is back, drop them there: ALTER SUBSCRIPTION \"{self.names.subscription}\" DISABLE; ALTER SUBSCRIPTION"
            f" \"{self.names.subscription}\" SET (slot_name = NONE); DROP SUBSCRIPTION \"{self.names.subscription}\"; then the schema"
            f"{'s' if len(self.ctxs) > 1 else ''} {schemas} and {'its row' if len(self.ctxs) == 1 else 'their rows'} in pgidgen.shards (state 'incoming')"
            " (docs/runbook.md, 'A move that failed or was killed')"
        )
        self.report.status = "rolled_back"
