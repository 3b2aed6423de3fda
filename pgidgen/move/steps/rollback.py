"""rollback: a move not yet past activate undone; the source serves the shard as before, nothing left on the target."""
from __future__ import annotations

from ...db import execute_script
from .. import sqltext as q
from ..context import MoveError
from .base import MoveReport, MoverBase
from .replication import teardown


class RollbackStep(MoverBase):
    def rollback(self) -> MoveReport:
        shard = self.ctx.shard
        try:
            rows = self._target_rows()
            if any(st == "active" for st, _ in rows.values()):
                raise MoveError(
                    f"the move of {self.what} is past its flip: {self.ctx.target} serves {'the shard' if len(self.ctxs) == 1 else 'them'} and may have taken writes",
                    hint=f"finish it with 'pgidgen move-shard --resume {shard}'; to go back, move {'the shard' if len(self.ctxs) == 1 else 'them'} again afterwards",
                )
            self.journal.log(self.rec.step, "rollback", {})
            teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))
            self._point("rollback:torn-down")
            if any(st == "incoming" for st, _ in rows.values()):
                with self.tgt.transaction():
                    self._drop_target_copy()
            src_rows = {int(r[0]): (r[1], r[2]) for r in self.admin.execute(
                "SELECT shard, state, schema_name FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}
            with self.admin.transaction():
                for c in self.ctxs:
                    st = src_rows.get(c.shard)
                    if st is not None and st[0] == "retired":
                        execute_script(self.admin, q.unretire_sql(c.shard, c.schema, st[1], [t.name for t in c.tables] + self._partitioned(st[1])))
                self.admin.execute("UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = ANY(%s) AND state = 'moving'", (self.shards,))
            self.journal.finish("rolled_back")
        finally:
            self._close()
        self.report.status = "rolled_back"
        return self.report
