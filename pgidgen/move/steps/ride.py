"""ride: a connection of pgidgen's own (to the source or the target) lost during a step, waited for within
--fault-wait, then the step run again from where the journal stands, as --resume would run it.

In order: what the step had open is let go (the copy's streams, the connections opened ahead, a verification in
flight); the source and the target are connected to again, as often as it takes until --fault-wait has passed;
the sessions whose connection was lost are seen to their end (terminated when they linger, as behind a link that
stalls), so whatever they were committing has committed or rolled back for good; the move's locks are taken again
(they went with the source's session) and its journal read again. Only then does the step run again, and it
looks first at what is there: the cutover asks the source's catalog whether its flip committed (a lost COMMIT may
have), the activation the target's, the copy starts over (its snapshot died with the slot's connection). A step
that has not got through within --fault-wait of its first lost connection (a link that keeps failing is not a
blip) gives up: the move stops resumable, as a killed one does."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import psycopg

from ...db import connect
from ...errors import PgidgenError
from ...redact import scrub
from ..context import MoveError
from ..faults import ConnectionLost, lost
from ..journal import open_move, try_lock_all
from .base import MoverBase

#: How long a lost session may linger on its server before it is terminated.
LINGER = 1.0


class RideThrough(MoverBase):
    def _ride(self, step: str, error: BaseException) -> bool:
        """After error in step: False when it is no lost connection (the caller raises it); True once the
        connections are back and the journal read again (the caller goes on from self.rec.step); else a MoveError
        (resumable) when the connection did not come back within --fault-wait of the step's first fault."""
        fault = lost(error)
        if fault is None:
            return False
        fault = scrub(fault)
        where = f"{self.ctx.source} (from {self.ctx.target}'s server)" if isinstance(error, ConnectionLost) else self._lost_where()
        if self.opts.fault_wait <= 0:
            raise self._gave_up(step, where, fault, "--fault-wait 0: no wait")
        now = time.perf_counter()
        t0, tries = self.rides.get(step, (now, 0))
        self.rides[step] = (t0, tries + 1)
        deadline = t0 + self.opts.fault_wait
        self._let_go()
        nap = min(0.05 * 2 ** tries, 1.0)  # a step cut off again and again: a little longer each time
        while True:
            self._waiting(f"lost the connection to {where} during step {step} ({fault}); waiting for it (up to {self.opts.fault_wait:g}s)")
            if time.perf_counter() + nap > deadline:
                raise self._gave_up(step, where, fault, f"not back within --fault-wait {self.opts.fault_wait:g}s")
            time.sleep(nap)
            nap = min(nap * 2, 1.0)
            try:
                self._reconnect(deadline)
                break
            except (psycopg.Error, PgidgenError) as e:
                again = lost(e)
                if again is None:
                    raise
                fault = scrub(again)
        took = time.perf_counter() - now
        self.report.faults.append({"step": step, "lost": where, "error": fault, "seconds": round(took, 3)})
        try:
            self.journal.log(step, "fault", {"lost": where, "error": fault, "seconds": round(took, 3), "resumes": self.rec.step})
        except psycopg.Error:
            pass  # lost again: the step's own first statement finds out
        self._waiting(None)
        return True

    def _gave_up(self, step: str, where: str, fault: str, why: str) -> MoveError:
        return MoveError(f"lost the connection to {where} during step {step} of the move of {self.what} ({why}): {fault}",
                         hint=self._next_hint(step))

    def _lost_where(self) -> str:
        """The databases whose connection is gone (asked with a round trip: a cut connection shows only when used)."""
        gone = [name for name, conn in ((self.ctx.source, self.admin), (self.ctx.target, self._tgt))
                if name in self.stale or conn is not None and not _alive(conn)]
        return " and ".join(gone) if gone else f"{self.ctx.source} or {self.ctx.target}"

    def _let_go(self) -> None:
        """What the interrupted step had open, ended: its runs start over."""
        if self.schema_dump is not None:
            self.schema_dump.close()
            self.schema_dump = None
        for c in self._take_ahead() or []:
            c.close()
        if self.catalog_ahead is not None:
            self.catalog_ahead.join()
            self.catalog_ahead = None
        if self.checking is not None:
            self.checking.join()
            try:
                self.verification = self.checking.result()  # it ended well: the comparison at the cutover point stands
            except (psycopg.Error, PgidgenError):
                pass
            self.checking = None
        if self.check_src is not None:
            self.check_src.close()
            self.check_src = None
        snap = self.snapshot
        if snap is not None and (snap.closed or snap.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS or not _alive(snap)):
            snap.close()
            self.snapshot = None

    def _reconnect(self, deadline: float) -> None:
        """The source (with the move's locks and its journal read again) and the target, connected again where lost;
        then every lost session seen to its end."""
        if not _alive(self.admin):
            self.lost_session(self.ctx.source, self.pids.pop("admin", 0))
            self.admin.close()
            conn = connect(self.ctx.source, self.config.dsn(self.ctx.source), autocommit=True)
            self.admin = self.journal.conn = conn
            self.pids["admin"] = conn.info.backend_pid
            self._settle(conn, self.ctx.source, deadline)
            busy = try_lock_all(conn, self.shards, patience=max(0.0, min(2.0, deadline - time.perf_counter())))
            if busy is not None:
                raise MoveError(f"another pgidgen took shard {busy} over while the connection to {self.ctx.source} was lost",
                                where=self.ctx.source, hint="let it finish the move (see 'pgidgen map' and the journal, pgidgen.move_log)")
            rec = open_move(conn, self.ctx.shard)
            if rec is None and self.finishing and conn.execute(
                    "SELECT 1 FROM pgidgen.moves WHERE move_id = %s AND status = 'done'", (self.rec.move_id,)).fetchone():
                rec = dataclasses.replace(self.rec, status="done", step="done")  # its last journal write went through
            if rec is None or rec.move_id != self.rec.move_id:
                raise MoveError(f"move {self.rec.move_id} of {self.what} was finished or rolled back by another pgidgen while the connection"
                                f" to {self.ctx.source} was lost", where=self.ctx.source, hint="see 'pgidgen map' and the journal (pgidgen.move_log)")
            for f in dataclasses.fields(rec):
                setattr(self.rec, f.name, getattr(rec, f.name))
        else:
            self._settle(self.admin, self.ctx.source, deadline)
        if self._tgt is not None and not _alive(self._tgt):
            self._tgt.close()  # the tgt property notes its session and connects again
        self._settle(self.tgt, self.ctx.target, deadline)

    def _settle(self, conn: psycopg.Connection[Any], database: str, deadline: float) -> None:
        """Wait until the lost sessions on database have ended (terminated once they linger past LINGER)."""
        pids = self.stale.get(database, set()) - {conn.info.backend_pid}
        t0 = time.perf_counter()
        while pids:
            live = [int(r[0]) for r in conn.execute(
                "SELECT pid FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s) AND usename = current_user", (sorted(pids),))]
            if not live:
                break
            now = time.perf_counter()
            if now - t0 > LINGER:
                conn.execute("SELECT pg_catalog.pg_terminate_backend(p) FROM pg_catalog.unnest(%s::int[]) p", (live,))
            if now > deadline:
                raise MoveError(f"pgidgen's earlier session{'s' if len(live) > 1 else ''} on {database} (pid {', '.join(map(str, live))}) did not end",
                                where=database, hint=f"end {'them' if len(live) > 1 else 'it'} (pg_terminate_backend), then --resume {self.ctx.shard}")
            time.sleep(0.02)
        self.stale.pop(database, None)


def _alive(conn: psycopg.Connection[Any]) -> bool:
    """Whether conn still talks to its server (a round trip; never raises)."""
    if conn.closed or conn.broken:
        return False
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        return False  # a statement of a thread that lost it is still "running"
    try:
        conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False
