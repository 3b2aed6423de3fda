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
            row = self._target_row()
            if row is not None and row[0] == "active":
                raise MoveError(
                    f"the move of shard {shard} is past its flip: {self.ctx.target} serves the shard and may have taken writes",
                    hint=f"finish it with 'pgidgen move-shard --resume {shard}'; to go back, move the shard again afterwards",
                )
            self.journal.log(self.rec.step, "rollback", {})
            teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))
            if row is not None and row[0] == "incoming":
                with self.tgt.transaction():
                    self.tgt.execute(f"DROP SCHEMA IF EXISTS {q.ident(self.ctx.schema)} CASCADE")
                    self.tgt.execute("DELETE FROM pgidgen.shards WHERE shard = %s AND state = 'incoming'", (shard,))
            src_row = self.admin.execute("SELECT state, schema_name FROM pgidgen.shards WHERE shard = %s", (shard,)).fetchone()
            with self.admin.transaction():
                if src_row is not None and src_row[0] == "retired":
                    execute_script(self.admin, q.unretire_sql(shard, self.ctx.schema, src_row[1], [t.name for t in self.ctx.tables] + self._partitioned(src_row[1])))
                else:
                    self.admin.execute("UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = %s AND state = 'moving'", (shard,))
            self.journal.finish("rolled_back")
        finally:
            self._close()
        self.report.status = "rolled_back"
        return self.report
