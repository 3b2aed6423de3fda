"""activate: the target serves the shard, its generator state (last ID, clock skew, sequences) carried over."""
from __future__ import annotations

import math
import time
from typing import Any

import psycopg

from ...db import connect, execute_script
from ...ddl.ledger import ledger_copy_sql_of
from .. import sqltext as q
from ..context import MoveError
from .base import MoverBase


class ActivateStep(MoverBase):
    def step_activate(self) -> None:
        # the retired copies' write guards: begun by the cutover right after its flip, or (a resumed run) now
        guarding, self.guarding = self.guarding, None
        if guarding is None:
            guarding = self._guard_apart(self._retired_now())
        try:
            self._activate()
        finally:
            guarding.join()
        guarding.result()

    def _retired_now(self) -> list[q.Retiring]:
        """The batch's retired copies (by the source's catalog: never a copy that serves) and the tables their guards go on
        (partitioned parents too)."""
        schemas = {int(r[0]): str(r[1]) for r in self.admin.execute(
            "SELECT shard, schema_name FROM pgidgen.shards WHERE shard = ANY(%s) AND state = 'retired'", (self.shards,))}
        parents = q.partitioned_of(self.admin, list(schemas.values()))
        return [q.Retiring(c.shard, c.schema, schemas[c.shard], [q.TableRef(c.schema, n) for n in parents[schemas[c.shard]]]
                           + [q.TableRef(c.schema, t.name) for t in c.tables]) for c in self.ctxs if c.shard in schemas]

    def _activate(self) -> None:
        state = self._target_state()
        if state == "active":
            return
        if self.resumed_step is not None:  # begun by an older pgidgen: its target's catalog may lack advance_generators
            self._ensure_target_catalog()
        if state != "incoming":
            raise MoveError(f"database {self.ctx.target} lost its copy of {self.what}", hint="see 'pgidgen map' and the journal (pgidgen.move_log)")
        shard = self.ctx.shard
        rerun = getattr(self, "pause_started", None) is None or self.report.faults  # an earlier run's, or one a lost connection cut short
        if self.resumed_step in ("cutover", "activate") and rerun and not self.opts.offline and self._sub_oid():
            # The cutover's catch-up was in an earlier run (or before a lost connection, perhaps a restart): a target
            # that restarted since may have lost applied changes (the apply worker commits asynchronously) and must
            # apply them again before it serves.
            if not self._beat(time.perf_counter() + self.opts.catchup_timeout):
                raise MoveError(f"database {self.ctx.target} has not applied all changes of {self.what} made before the flip",
                                where=f"{self.ctx.target}'s subscription {self.names.subscription}",
                                hint=f"see pg_stat_subscription and the target's server log, then --resume {shard}")
        if self.snapshot is None and self.verification is None and self.checking is None:
            # the cutover's snapshot was lost (with an interrupted run, or a connection: steps/ride.py); the source
            # is retired and nobody serves the shard until this commits: the target as it stands is the cutover point
            self.snapshot = self._target_snapshot()
        last_ids, seqs = self._generators_and_sequences({c.shard: c.source_schema for c in self.ctxs})
        skew = float(self.rec.detail.get("skew_ms", 0.0))
        unc = float(self.rec.detail.get("skew_uncertainty_ms", 0.0))
        ahead = math.ceil(-skew + unc) + 1
        if len(self.ctxs) == 1:
            self.journal.note("activate", last_id=last_ids[shard], ahead_ms=ahead)
        else:
            self.journal.note("activate", last_ids={str(k): v for k, v in last_ids.items()}, ahead_ms=ahead)
        sub = None if self.opts.offline else (self.names.subscription if self._sub_oid() else None)
        ledger = self.ledger_sql if self.ledger_sql is not None else self._ledger()
        t_activate = time.perf_counter()
        with self.tgt.transaction():
            execute_script(self.tgt, ledger)
            execute_script(self.tgt, q.activate_many_sql(
                [q.Activating(c.shard, c.schema, last_ids[c.shard], seqs.get(c.shard, [])) for c in self.ctxs], ahead_ms=ahead, subscription=sub))
        started = getattr(self, "pause_started", None)
        if self.snapshot is not None and self.verification is None and self.checking is None:
            self._start_checking(self.snapshot)
        if started is not None:
            done = time.perf_counter()
            self.report.pause_ms = (done - started) * 1000
            parts = dict(self.pause_parts, read_ms=t_activate - started - sum(self.pause_parts.values()), activate_ms=done - t_activate)
            self.report.pause_parts = {k: round(v * 1000, 1) for k, v in parts.items()}
            self.journal.note("activate", pause_ms=round(self.report.pause_ms, 1), pause_parts=self.report.pause_parts)

    def _target_snapshot(self) -> psycopg.Connection[Any]:
        """A REPEATABLE READ snapshot of the target, held open on a connection of its own (for step_verify)."""
        snap = connect(self.ctx.target, self.config.dsn(self.ctx.target))
        snap.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snap.execute("SELECT 1 FROM pgidgen.shards LIMIT 1")
        return snap

    def _ledger(self) -> str:
        """The batch's DDL-ledger rows as SQL for the target (read before the pause: apply-ddl waits for moves)."""
        return ledger_copy_sql_of(self.admin, self.shards)

    def _generators_and_sequences(self, schemas: dict[int, str]) -> tuple[dict[int, int], dict[int, list[q.SeqValue]]]:
        """In the pause, after the source's flip: each shard's last ID (its generator's counter and offset, as
        pgidgen.last_id reads them) and its own sequences (serial, identity, ...) as they stand, in one statement
        for the batch (SEQUENCE_VALUES_SQL: the names through pg_depend's index, each value through
        pg_sequence_last_value, one plan for them all; a UNION ALL of a SELECT per sequence planned each of them,
        1 ms a shard on a connection new to them), and a second only for those it shows NULL: not yet called (as
        after ALTER SEQUENCE ... RESTART), whose last_value and is_called come from the sequence itself (carrying
        its start value instead would hand values out again). The cutover ran the first before the pause (its connection
        then finds them open)."""
        shard_of = {schema: shard for shard, schema in schemas.items()}
        rows = self.admin.execute(q.SEQUENCE_VALUES_SQL, (list(schemas.values()),)).fetchall()
        found = {(str(r[0]), str(r[1])) for r in rows}
        missing = [f"{s}.{n}" for s in schemas.values() for n in q.GENERATOR_SEQUENCES if (s, n) not in found]
        if missing:
            raise MoveError(f"the source copy lost its ID generator's sequence {missing[0]}", where=self.ctx.source,
                            hint=f"nothing serves these shards until the move activates: put that sequence back under its name with its value, then --resume {self.ctx.shard}")
        values: dict[tuple[str, str], tuple[int, bool]] = {(str(r[0]), str(r[1])): (int(r[2]), True) for r in rows if r[2] is not None}
        reads = [f"SELECT {q.literal(str(r[0]))}, {q.literal(str(r[1]))}, last_value, is_called FROM {q.ident(str(r[0]), str(r[1]))}"
                 for r in rows if r[2] is None]
        if reads:
            for r in self.admin.execute(" UNION ALL ".join(reads)):
                values[(str(r[0]), str(r[1]))] = (int(r[2]), bool(r[3]))
        layout = self.ctx.layout
        last_ids = {shard: layout.last_id(shard, values[(s, "pgidgen_counter")][0], values[(s, "pgidgen_offset")][0]) for shard, s in schemas.items()}
        out: dict[int, list[q.SeqValue]] = {}
        for (s, n), (last, called) in values.items():
            if n not in q.GENERATOR_SEQUENCES:
                out.setdefault(shard_of[s], []).append(q.SeqValue(n, last, called))
        return last_ids, out
