"""cutover: the write pause. The shard's tables are frozen on the source, the schema compared on both sides, the
last changes applied on the target, and the source copy retired, all within --max-pause."""
from __future__ import annotations

import time
from typing import Any

import psycopg

from ...db import connect, execute_script
from ...ddl.drift import ITEMS_SQL, schema_items
from .. import depsql as dq
from .. import sqltext as q
from ..context import MoveError, describe_dependents, outside_dependents
from ..journal import retired_names
from ..unlogged import copy_unlogged
from .base import LOCK_WAIT_RECHECK, Background, CutoverAborted, MoverBase

#: drift.SCHEMA_ITEMS_SQL for a batch's schemas at once: (schema, item).
SCHEMA_ITEMS_MANY_SQL = ITEMS_SQL.replace(
    """    SELECT n.oid AS nsp, n.nspname, sh.shard
    FROM pgidgen.shards sh JOIN pg_catalog.pg_namespace n ON n.nspname = sh.schema_name
    WHERE sh.state IN ('active', 'moving') {filter}""",
    """    SELECT n.oid AS nsp, n.nspname, n.oid::pg_catalog.int8 AS shard FROM pg_catalog.pg_namespace n WHERE n.nspname = ANY(%(schemas)s)""",
).replace(  # a batch's schemas: their relations through pg_depend's index, not a pass over pg_class
    "    SELECT c.* FROM pg_catalog.pg_class c WHERE c.relnamespace IN (SELECT nsp FROM s)",
    "    " + q.relations_of("(SELECT nsp AS oid FROM s)", "c.*"),
).replace("{index_filter}", "AND ix.indisvalid") + "SELECT s.nspname, replace(i.item, s.nspname || '.', 'shard_N.') FROM items i JOIN s ON s.shard = i.shard"
assert "%(schemas)s" in SCHEMA_ITEMS_MANY_SQL and "pg_depend d" in SCHEMA_ITEMS_MANY_SQL


def schema_items_many(conn: psycopg.Connection[Any], schemas: list[str]) -> dict[str, set[str]]:
    """drift.schema_items of each schema, in one query."""
    if len(schemas) == 1:
        return {schemas[0]: schema_items(conn, schemas[0])}
    out: dict[str, set[str]] = {s: set() for s in schemas}
    for schema, item in conn.execute(SCHEMA_ITEMS_MANY_SQL, {"schemas": schemas}):
        out[schema].add(str(item))
    return out


#: What locking one table takes in the freeze when nothing holds it (LOCK_WAIT_RECHECK is for the whole freeze).
LOCK_PER_TABLE_S = 0.0002


class CutoverSteps(MoverBase):
    def step_cutover(self) -> None:
        if self._source_retired():
            return
        if self.opts.offline and self.resumed_step == "cutover":
            # The offline copy commits on the target before the source is retired: a run interrupted between
            # the two left a full copy there (indexes and constraints included), which the copy cannot go into
            # again. The source still serves; start the target's copy over (its schema too, should an earlier
            # resume have stopped between dropping and making it).
            if self._target_rows():
                self._reset_copy()
            self.step_schema()
        if "skew_ms" not in self.rec.detail:
            self._measure_skew()
        attempts = max(1, self.opts.attempts)
        last: CutoverAborted | None = None
        for attempt in range(1, attempts + 1):
            self.report.attempts = attempt
            try:
                self._cutover_once()
                return
            except CutoverAborted as e:
                last = e
                self.journal.log("cutover", "aborted", {"attempt": attempt, "reason": str(e)})
                if attempt < attempts:
                    time.sleep(0.2 * attempt)
                    if not self.opts.offline:
                        self.step_catchup()
        assert last is not None
        raise CutoverAborted(f"{last} ({attempts} attempts)")

    def _source_retired(self) -> bool:
        """Whether this move's cutover committed on the source (all of the batch's shards retire in it)."""
        retired = retired_names(self.rec)
        if not retired:
            return False
        rows = {int(r[0]): (r[1], r[2]) for r in self.admin.execute(
            "SELECT shard, state, schema_name FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}
        if not all(rows.get(c.shard) == ("retired", retired.get(c.shard)) for c in self.ctxs):
            return False
        for c in self.ctxs:
            c.source_schema = retired[c.shard]
        return True

    def _cutover_once(self) -> None:
        shard = self.ctx.shard
        stamp = time.strftime('%Y%m%d%H%M%S', time.gmtime())
        retired = {c.shard: f"{c.schema}_moved_{stamp}" for c in self.ctxs}
        if len(self.ctxs) == 1:
            self.journal.note("cutover", retired_schema=retired[shard])
        else:
            self.journal.note("cutover", retired_schemas={str(k): v for k, v in retired.items()})
        schemas = [c.schema for c in self.ctxs]
        # per shard: parents first, as writers lock them
        parents = q.partitioned_of(self.admin, schemas)
        guarded = {c.shard: [q.TableRef(c.schema, name) for name in parents[c.schema]] + [q.TableRef(c.schema, t.name) for t in c.tables]
                   for c in self.ctxs}
        budget = self.opts.max_pause
        ahead = self._take_ahead()
        if ahead is not None:
            src, snap, self.check_src = ahead
        else:
            src = connect(self.ctx.source, self.config.dsn(self.ctx.source))
            snap = connect(self.ctx.target, self.config.dsn(self.ctx.target))  # before the pause
        src_pid = src.info.backend_pid  # a COMMIT lost with its connection may have committed: see steps/ride.py
        # the target's side, read before the pause, on a thread while the source's side is read (offline: no
        # items, post-data comes under the freeze)
        reading = Background(lambda: (self._tables_as_they_stand(self.tgt, schemas), schema_items_many(self.tgt, schemas) if not self.opts.offline else {}))
        try:
            if not self.opts.offline:
                # The schema on both sides, and nothing outside the shard depending on it, checked right before the
                # pause rather than in it (some 20 ms under load): DDL that does not wait for the freeze's locks
                # (a view, a grant, a function) could slip in after a check made in the pause just the same.
                my_items = schema_items_many(src, schemas)
                outside = outside_dependents(src, schemas[0]) if len(schemas) == 1 else \
                    [str(r[0]) for r in src.execute(dq.OUTSIDE_DEPENDENTS_ANY_SQL, {"schemas": schemas})]
                src.rollback()
        finally:
            reading.join()
        theirs, their_items = reading.result()
        if not self.opts.offline:
            for schema in schemas:
                changed = self._changed_objects(my_items[schema], their_items[schema])
                found = outside
                if found:  # made during the move: they would stay bound to the retired copy
                    changed.append(f"objects outside it now depend on it: {describe_dependents(found)}")
                if changed:
                    src.close()
                    snap.close()
                    raise MoveError(f"the tables of {schema} changed during the move ({'; '.join(changed)})", where=self.ctx.source,
                                    hint=f"nothing was flipped; roll back with --rollback {shard} and move again")
            self._tables_as_they_stand(src, schemas, prepare=True)  # the query the pause makes: planned before it
            src.rollback()
        if self.ledger_sql is None:
            self.ledger_sql = self._ledger()
        # the pause reads every sequence of the batch on this connection after the flip (activate): opening them
        # here first leaves it only their values to read there (1 ms a shard on a connection new to them)
        self.admin.execute(q.SEQUENCE_VALUES_SQL, (schemas,)).fetchall()
        # and on the target, where activate advances the batch's generators and sets its sequences: the copy made
        # them on this connection, but its commit dropped their cache entries (measured on 15, 300 shards: 94 ms
        # of that work on cold entries, 31 ms on warm ones)
        self.tgt.execute(q.SEQUENCE_VALUES_SQL, (schemas,)).fetchall()
        committed = False
        try:
            t_start = time.perf_counter()
            deadline = t_start + budget
            try:
                execute_script(src, q.freeze_sql(self.shards, [t for c in self.ctxs for t in guarded[c.shard]], int(budget * 1000))
                               # offline, the copy runs in the pause; --verify-in-pause, the compare (src idles between its passes)
                               + ("" if self.opts.offline or self.opts.verify_in_pause else q.pause_guard_sql(budget)))
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                src.rollback()
                whose = "the shard's tables" if len(self.ctxs) == 1 else f"the tables of {self.what}"
                raise CutoverAborted(f"{whose} could not be locked within --max-pause {budget * 1000:.0f} ms (long transactions on them?)") from None
            t_frozen = time.perf_counter()
            # locking a batch's tables takes some 0.1 ms each: longer, and the freeze waited for a lock
            waited = t_frozen - t_start > LOCK_WAIT_RECHECK + LOCK_PER_TABLE_S * sum(len(g) for g in guarded.values())
            mine_all = self._tables_as_they_stand(src, schemas, prepare=not self.opts.offline)
            again: dict[str, set[str]] | None = None
            for c in self.ctxs:
                mine, schema = mine_all.get(c.schema, {}), c.schema
                now = set(mine)
                if now != {t.name for t in c.tables}:
                    src.rollback()
                    raise MoveError(
                        f"the tables of {schema} changed during the move ({', '.join(sorted(now ^ {t.name for t in c.tables}))})",
                        where=self.ctx.source, hint=f"tables created or dropped mid-move are not replicated: roll back with --rollback {shard} and move again",
                    )
                changed = self._changed_tables(mine, theirs.get(schema, {}))
                if not changed and waited and not self.opts.offline:
                    # the locks were waited for: DDL that held one (CREATE INDEX, ALTER TABLE, CREATE POLICY, ...) may
                    # have committed meanwhile, after the check made before the pause
                    again = again if again is not None else schema_items_many(src, schemas)
                    changed = self._changed_objects(again[schema], their_items[schema])
                if changed:
                    src.rollback()
                    raise MoveError(
                        f"the tables of {schema} changed during the move ({'; '.join(changed)})", where=self.ctx.source,
                        hint=f"nothing was flipped; roll back with --rollback {shard} and move again",
                    )
            t_checked = time.perf_counter()
            if self.opts.offline:
                self._offline_copy()
            elif not self._beat(deadline):
                src.rollback()
                raise CutoverAborted(f"the target did not catch up within --max-pause {budget * 1000:.0f} ms")
            else:
                unlogged = [(c.schema, t.name) for c in self.ctxs for t in c.tables if t.persistence != "p"]
                if unlogged:  # not replicated: their rows as the freeze leaves them
                    rows = copy_unlogged(src, self.tgt, unlogged)
                    self.report.notes.append(f"unlogged {', '.join(f'{s}.{t}' for s, t in unlogged)}: {rows} rows copied in the pause"
                                             " (logical replication does not carry unlogged tables)")
            assert snap is not None
            snap.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snap.execute("SELECT 1 FROM pgidgen.shards LIMIT 1")  # the snapshot: the target at the cutover point
            self._point("cutover:frozen")
            if self.opts.offline or self.opts.verify_in_pause:
                v = self._compare_all(src, {c.shard: c.schema for c in self.ctxs}, snap, when="at the cutover point, before the flip")
                if not v.ok:
                    src.rollback()
                    self.verification = v
                    raise MoveError(
                        f"the copy of {self.what} on {self.ctx.target} differs from the source: "
                        + "; ".join(t.describe() for t in v.mismatches()),
                        hint=f"nothing was flipped; the source keeps serving; roll back with --rollback {shard}",
                    )
                self.verification = v
            t_caught = time.perf_counter()
            retiring = [q.Retiring(c.shard, c.schema, retired[c.shard], guarded[c.shard]) for c in self.ctxs]
            execute_script(src, q.retire_many_sql(retiring))
            self.pause_started = t_start  # a COMMIT lost with its connection may have begun the flip (steps/ride.py)
            src.commit()
            committed = True
            t_retired = time.perf_counter()
            self.pause_parts = {"lock_ms": t_frozen - t_start, "compare_ms": t_checked - t_frozen, "catchup_ms": t_caught - t_checked,
                                "retire_ms": t_retired - t_caught}
            for c in self.ctxs:
                c.source_schema = retired[c.shard]
            self.pause_started = t_start
            self.guarding = self._guard_apart(retiring)  # the retired copies' write guards, while the target activates
        finally:
            if src.broken:
                self.lost_session(self.ctx.source, src_pid)
            if not committed and not src.closed:
                src.rollback()
            src.close()
            if not committed and snap is not None:
                snap.close()
        self.snapshot = snap

    def _tables_as_they_stand(self, conn: psycopg.Connection[Any], schemas: list[str], *, prepare: bool | None = None) -> dict[str, dict[str, tuple[str, bool]]]:
        """Per schema, per table: its columns (name and type, by name) and whether the move's publication holds
        it. One catalog query for the batch: on the source it runs inside the pause."""
        out: dict[str, dict[str, tuple[str, bool]]] = {}
        for r in conn.execute(q.TABLES_AS_THEY_STAND_MANY_SQL, {"schemas": schemas, "publication": self.names.publication}, prepare=prepare):
            out.setdefault(r[0], {})[r[1]] = (r[2] or "", bool(r[3]))
        return out

    def _changed_tables(self, mine: dict[str, tuple[str, bool]], theirs: dict[str, tuple[str, bool]]) -> list[str]:
        """Under the freeze, before the flip: tables whose columns differ between source and target (DDL on one
        side mid-move), and, online, tables the publication does not hold (dropped and created again under
        the same name: their rows since were never replicated)."""
        changed = [f"{name}: columns {mine[name][0] if name in mine else 'none'} on {self.ctx.source},"
                   f" {theirs[name][0] if name in theirs else 'none'} on {self.ctx.target}"
                   for name in sorted(set(mine) | set(theirs)) if mine.get(name, ("",))[0] != theirs.get(name, ("",))[0]]
        if not self.opts.offline:
            changed += [f"{name}: not the table the move publishes (created again?)" for name in sorted(mine) if not mine[name][1]]
        return changed

    def _changed_objects(self, mine: set[str], theirs: set[str]) -> list[str]:
        """Indexes, constraints, defaults, triggers, views, functions, types (what status --drift compares) that
        differ: DDL on the source after the copy read its schema is not replicated."""
        out = []
        for side, items in ((self.ctx.source, sorted(mine - theirs)), (self.ctx.target, sorted(theirs - mine))):
            if items:
                out.append(f"only on {side}: {', '.join(items[:3])}" + (f" and {len(items) - 3} more" if len(items) > 3 else ""))
        return out
