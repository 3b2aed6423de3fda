"""publication, subscription and catchup: the changes made after the copy's snapshot stream to the target until
a heartbeat arrives within half the pause budget; teardown drops the three (and any slot left behind)."""
from __future__ import annotations

import secrets
import time
from typing import Any

import psycopg

from ...check import conninfo_for_subscription, subscribe_quietly
from ...db import execute_script
from ...versions import has
from .. import sqltext as q
from ..context import MoveError
from ..faults import ConnectionLost, refusal_lost
from .applywatch import ERROR_CONFLICTS, ApplyWatch
from .base import POLL, CopyProgress, CutoverAborted, MoverBase


class ReplicationSteps(MoverBase):
    def step_publication(self) -> None:
        self._set_identities()  # before anything publishes them: updates and deletes on them would fail
        if self.admin.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.names.publication,)).fetchone():
            return
        tables = [q.TableRef(c.schema, t.name) for c in self.ctxs for t in c.tables if t.persistence == "p"]  # unlogged: copied in the pause
        with self.admin.transaction():
            execute_script(self.admin, q.publication_sql(self.names, tables))

    def step_subscription(self) -> None:
        row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        if row is None:
            conninfo = conninfo_for_subscription(self.opts.subscription_conninfo or self.config.dsn(self.ctx.source), self.admin)
            # a failed CREATE SUBSCRIPTION is logged with its text, which holds the password: run so that it is not
            failed = subscribe_quietly(self.tgt, q.subscription_sql(self.names, conninfo), keep=True, conninfo=conninfo)
            if failed is not None and refusal_lost(failed.sqlstate, failed.message):  # the network's, not the login's: waited for (steps/ride.py)
                raise ConnectionLost(f"database {self.ctx.target} could not reach {self.ctx.source} to subscribe: {failed.message}")
            if failed is not None:
                raise MoveError(
                    f"database {self.ctx.target} could not subscribe to {self.ctx.source}: {failed.message}",
                    hint=f"the target server itself must reach the source with the connection string in the config (with the password pgidgen logged in with; 'pgidgen check' tests it);"
                         f" then 'pgidgen move-shard {self.ctx.shard} --resume' (with --subscription-dsn DSN if it needs another one), or '--rollback'",
                )
            row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        assert row is not None
        self.journal.note("subscription", subscription_oid=int(row[0]))
        self.apply_watch = ApplyWatch(self, int(row[0]))  # its failures counted from here on

    def _sub_oid(self) -> int | None:
        row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        return int(row[0]) if row else None

    def _errors(self, oid: int) -> int:
        row = self.tgt.execute("SELECT coalesce(apply_error_count + sync_error_count, 0) FROM pg_stat_subscription_stats WHERE subid = %s", (oid,)).fetchone()
        return int(row[0]) if row else 0

    def _lag(self) -> int | None:
        row = self.admin.execute(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s", (self.names.slot,)
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _beat(self, deadline: float) -> bool:
        """Write a heartbeat on the source and wait until the target has applied it (or the deadline passes).
        The wait is for this very row: a beat is a random number, not a time, so neither a clock that steps back
        nor a resume on another host can make an older beat pass for it."""
        beat = secrets.randbits(62) + 1
        execute_script(self.admin, q.heartbeat_sql(self.rec.token, beat))
        while True:
            if self.tgt.execute("SELECT 1 FROM pgidgen.move_heartbeat WHERE token = %s AND beat = %s", (self.rec.token, beat)).fetchone():
                return True
            if time.perf_counter() > deadline:
                return False
            time.sleep(POLL)

    def step_catchup(self) -> None:
        """Wait until replication keeps up (a heartbeat arrives within half the pause budget); measure the skew.
        The apply worker's failures are watched (ApplyWatch): one that reconnects is waited for, one that stays
        fails the move."""
        self._open_ahead()
        oid = self._sub_oid()
        if oid is not None and (self.apply_watch is None or self.apply_watch.oid != oid):
            self.apply_watch = ApplyWatch(self, oid)
        watch = self.apply_watch
        # while the apply worker starts (10-20 ms): the clocks' skew, and the DDL ledger's rows the activation
        # copies (apply-ddl waits for moves: they are what they will be in the pause)
        self._measure_skew()
        if self.ledger_sql is None:
            self.ledger_sql = self._ledger()
        give_up = time.perf_counter() + self.opts.catchup_timeout
        while True:
            t = time.perf_counter()
            arrived = self._beat(min(give_up, t + max(self.opts.max_pause, 1.0)))
            fast = arrived and time.perf_counter() - t <= self.opts.max_pause / 2
            waiting = watch.look(arrived, t) if watch is not None and not fast else None
            if arrived and watch is not None:
                watch.applied()
                waiting = None
            if fast:
                break
            if time.perf_counter() > give_up:
                raise CutoverAborted(f"replication did not catch up within {self.opts.catchup_timeout:.0f}s")
            if self.progress is not None:
                ntables = sum(len(c.tables) for c in self.ctxs)
                self.progress(CopyProgress(ntables, ntables, 0, 0, 0, self._lag(), waiting=waiting))

    def _confirmed(self) -> int | None:
        """The slot's confirmed_flush_lsn (what the target has applied) as a number."""
        row = self.admin.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = %s", (self.names.slot,)).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _conflicts(self, oid: int) -> dict[str, int]:
        """PostgreSQL 18+: the apply worker's conflicts that stop it (ERROR_CONFLICTS), by kind."""
        if not has(self.tgt, "subscription_conflict_stats"):
            return {}
        row = self.tgt.execute(f"SELECT {', '.join(ERROR_CONFLICTS)} FROM pg_stat_subscription_stats WHERE subid = %s", (oid,)).fetchone()
        return {k: int(v or 0) for k, v in zip(ERROR_CONFLICTS, row or (), strict=False)}

    def _apply_cause(self, conflicts0: dict[str, int]) -> None:
        """A cause of the apply worker's failure that the catalogs show, raised at once: the tables changed on one
        side (the worker misses a column), or (18+) a unique constraint on the target refuses a replicated row."""
        schemas = [c.schema for c in self.ctxs]
        mine, theirs = self._tables_as_they_stand(self.admin, schemas), self._tables_as_they_stand(self.tgt, schemas)
        for schema in schemas:
            changed = self._changed_tables(mine.get(schema, {}), theirs.get(schema, {}))
            if changed:
                raise MoveError(f"applying changes of {self.what} on {self.ctx.target} fails: the tables of {schema} changed during the move"
                                f" ({'; '.join(changed)})", where=self.ctx.source,
                                hint=f"nothing was flipped; roll back with --rollback {self.ctx.shard} and move again")
        oid = self._sub_oid()
        grown = {k: n - conflicts0.get(k, 0) for k, n in (self._conflicts(oid) if oid else {}).items() if n > conflicts0.get(k, 0)}
        if grown:
            kinds = ", ".join(f"{k.removeprefix('confl_')} {n}" for k, n in sorted(grown.items()))
            raise MoveError(f"applying changes of {self.what} on {self.ctx.target} fails: a unique constraint there refuses a replicated row ({kinds})",
                            where=f"{self.ctx.target}'s server log names the row",
                            hint=f"remove what conflicts on {self.ctx.target} (nothing but the move should write there), then --resume {self.ctx.shard}, or --rollback {self.ctx.shard}")

    def _measure_skew(self) -> None:
        skew, unc = measure_skew(self.admin, self.tgt)
        self.journal.note("catchup", skew_ms=round(skew, 3), skew_uncertainty_ms=round(unc, 3))

    def step_teardown(self) -> None:
        teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))


def teardown(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], names: q.Names, sub_oid: int | None) -> None:
    """Drop the subscription, the slots (ours and any table-sync slots left behind) and the publication."""
    row = tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (names.subscription,)).fetchone()
    if row is not None:
        sub_oid = sub_oid or int(row[0])
        for stmt in q.drop_subscription_sql(names.subscription).splitlines():
            tgt.execute(stmt)
    drop_slots(src, names, sub_oid)
    execute_script(src, q.drop_publication_sql(names))
    if tgt.execute("SELECT to_regclass('pgidgen.move_heartbeat') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
        tgt.execute("DELETE FROM pgidgen.move_heartbeat WHERE token = %s", (names.token,))


def drop_slots(src: psycopg.Connection[Any], names: q.Names, sub_oid: int | None, *, wait: float = 15.0) -> None:
    """A slot stays active until its walsender notices the subscriber left (usually within milliseconds): look
    again soon, then less often; after wait, end that walsender."""
    pattern = f"pg_{sub_oid}_sync_%" if sub_oid else None
    deadline = time.monotonic() + wait
    nap = POLL
    while True:
        rows = src.execute(
            "SELECT slot_name, active, active_pid FROM pg_replication_slots WHERE slot_name = %s OR slot_name LIKE %s",
            (names.slot, pattern or names.slot),
        ).fetchall()
        if not rows:
            return
        for name, active, pid in rows:
            if not active:
                try:
                    src.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                except psycopg.errors.ObjectInUse:
                    pass
                except psycopg.errors.UndefinedObject:
                    pass
            elif time.monotonic() > deadline and pid:
                src.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(nap)
        nap = min(nap * 2, 0.05)


def measure_skew(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], rounds: int = 5) -> tuple[float, float]:
    """(target clock - source clock, uncertainty) in ms, each server read against this machine's clock; the
    round with the shortest round trips wins, and half of both round trips is the uncertainty."""
    best: tuple[float, float] | None = None
    query = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8"
    for _ in range(rounds):
        a0 = time.time()
        s = float(src.execute(query).fetchone()[0])  # type: ignore[index]
        a1 = time.time()
        b0 = time.time()
        t = float(tgt.execute(query).fetchone()[0])  # type: ignore[index]
        b1 = time.time()
        skew = (t - (b0 + b1) * 500) - (s - (a0 + a1) * 500)
        unc = ((a1 - a0) + (b1 - b0)) * 500
        if best is None or unc < best[1]:
            best = (skew, unc)
    assert best is not None
    return best
