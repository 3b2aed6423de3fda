"""activate: the target serves the shard, its generator state (last ID, clock skew, sequences) carried over."""
from __future__ import annotations

import math
import time

from ...ddl.ledger import ledger_copy_sql
from ...db import execute_script
from .. import sqltext as q
from ..context import MoveError
from .base import MoverBase


class ActivateStep(MoverBase):
    def step_activate(self) -> None:
        row = self._target_row()
        if row is not None and row[0] == "active":
            return
        if row is None or row[0] != "incoming":
            raise MoveError(f"database {self.ctx.target} lost its copy of shard {self.ctx.shard}", hint="see 'pgidgen map' and the journal (pgidgen.move_log)")
        shard, retired = self.ctx.shard, self.ctx.source_schema
        if self.resumed_step in ("cutover", "activate") and getattr(self, "pause_started", None) is None and not self.opts.offline and self._sub_oid():
            # The cutover's catch-up was in an earlier run: a target that restarted since may have lost applied
            # changes (the apply worker commits asynchronously) and must apply them again before it serves.
            if not self._beat(time.perf_counter() + self.opts.catchup_timeout):
                raise MoveError(f"database {self.ctx.target} has not applied all changes of shard {shard} made before the flip",
                                where=f"{self.ctx.target}'s subscription {self.names.subscription}",
                                hint=f"see pg_stat_subscription and the target's server log, then --resume {shard}")
        last_id = int(self.admin.execute("SELECT pgidgen.last_id(%s)", (shard,)).fetchone()[0])  # type: ignore[index]
        seqs = self._sequence_values(retired)
        skew = float(self.rec.detail.get("skew_ms", 0.0))
        unc = float(self.rec.detail.get("skew_uncertainty_ms", 0.0))
        ahead = math.ceil(-skew + unc) + 1
        self.journal.note("activate", last_id=last_id, ahead_ms=ahead)
        sub = None if self.opts.offline else (self.names.subscription if self._sub_oid() else None)
        ledger = ledger_copy_sql(self.admin, shard)
        with self.tgt.transaction():
            execute_script(self.tgt, ledger)
            execute_script(self.tgt, q.activate_sql(shard, self.ctx.schema, last_id=last_id, ahead_ms=ahead, sequences=seqs, subscription=sub))
        started = getattr(self, "pause_started", None)
        if self.snapshot is not None and self.verification is None and self.checking is None:
            self._start_checking(self.snapshot, retired)
        if started is not None:
            self.report.pause_ms = (time.perf_counter() - started) * 1000
            self.journal.note("activate", pause_ms=round(self.report.pause_ms, 1))

    def _sequence_values(self, schema: str) -> list[q.SeqValue]:
        """The shard's own sequences (serial, identity, ...) as they stand: last_value and is_called read from
        each sequence itself (pg_sequences shows NULL for one not yet called, as after ALTER SEQUENCE ... RESTART,
        and for one the reader may not see; carrying its start value instead would hand values out again)."""
        names = [r[0] for r in self.admin.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'S'"
            " AND c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset') ORDER BY 1", (schema,))]
        if not names:
            return []
        query = " UNION ALL ".join(f"SELECT {q.literal(n)}, last_value, is_called FROM {q.ident(schema, n)}" for n in names)
        return [q.SeqValue(r[0], int(r[1]), bool(r[2])) for r in self.admin.execute(query)]
