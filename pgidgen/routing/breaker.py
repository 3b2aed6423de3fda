"""A database that cannot be connected to is not a move. After a connect to one failed (or a connection to it
broke and a new one could not be made), the Router's breaker fails the calls for that database's shards at once
with DatabaseUnavailableError, which names it, instead of each waiting for a connection that will not come and
then being retried as if a move were switching the shard over; the other databases' shards are served meanwhile.
Every probe_every seconds one call is let through to connect again (half-open): if that works the breaker closes
and the call goes on, else it fails like the others.

The check on every unit of work is `name in breaker.down`, a dict that stays empty while every database answers:
no lock, no clock. The lock is taken only while a database is down, by the calls that find it so."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg

from ..db import pg_message
from ..errors import DatabaseUnavailableError

#: How often one call is let through to a database that is down, to notice it is back (seconds).
PROBE_EVERY = 1.0
#: The Router's connect_timeout where the connection string and PGCONNECT_TIMEOUT set none (seconds; libpq's
#: least): how long the first call that finds a database down may wait before it fails.
CONNECT_TIMEOUT = 2
#: A connection lost because its server went away: shutting down, crashed, not accepting connections, or the
#: link itself (class 08).
GONE_STATES = frozenset({"57P01", "57P02", "57P03"})


def went_away(e: BaseException) -> bool:
    """Whether e is a connection failure that may mean the server is gone (a psycopg error: no SQLSTATE, as any
    failed connect has, class 08, or 57P01-57P03), so whether it is can be asked with one connect."""
    if not isinstance(e, psycopg.OperationalError):
        return False
    state = e.sqlstate
    return state is None or state.startswith("08") or state in GONE_STATES


def no_answer(e: BaseException) -> bool:
    """Whether a failed connect got no answer from a server (refused, timed out, no route, no such host), as
    opposed to a server's refusal (a password, a missing database, too many clients), which libpq quotes with its
    severity: a pool that cannot grow on a busy server is not down. (A server whose messages are translated may
    name the severity otherwise: then it counts as no answer, the safe side for a breaker.)"""
    return isinstance(e, psycopg.OperationalError) and "FATAL" not in str(e).upper()


class Outage:
    """One database's time down: why, and when the next call may try it."""

    __slots__ = ("next_probe", "probing", "reason")

    def __init__(self, reason: str, next_probe: float) -> None:
        self.reason = reason
        self.next_probe = next_probe
        self.probing = False


class Breaker:
    """The breakers of one Router's databases (thread-safe; the AsyncRouter shares its sync Router's).

    reach(name): connect to the database once and close, raising psycopg.Error if that fails; describe(name): where
    it is, for messages (host:port/dbname, never a password). Whoever keeps connections to a database that went
    down registers on_trip to drop them (a pool in reconnection backoff would keep the calls waiting after the
    server is back)."""

    def __init__(
        self,
        *,
        reach: Callable[[str], None],
        describe: Callable[[str], str],
        probe_every: float = PROBE_EVERY,
        stats: dict[str, int],
    ) -> None:
        self.down: dict[str, Outage] = {}
        self.probe_every = probe_every
        self.stats = stats
        self._reach = reach
        self._describe = describe
        self._lock = threading.Lock()
        self._tripped: list[Callable[[str], None]] = []

    def on_trip(self, callback: Callable[[str], None]) -> None:
        """callback(name) when a database goes down (once an outage, outside the lock, in the thread that found it)."""
        self._tripped.append(callback)

    def error(self, name: str) -> DatabaseUnavailableError:
        outage = self.down.get(name)
        reason = outage.reason if outage is not None else "it did not answer"
        self.stats["unreachable"] = self.stats.get("unreachable", 0) + 1
        return DatabaseUnavailableError(
            f"database {name} ({self._describe(name)}) is unreachable: {reason}",
            database=name,
            hint=f"check that its server is running and accepts connections; until it answers, calls for its shards fail"
            f" at once (one is let through every {self.probe_every:g}s to notice it is back) and the other databases'"
            " shards are served",
        )

    def trip(self, name: str, e: BaseException) -> DatabaseUnavailableError:
        """A connect to name failed: open its breaker (or keep it open, with the latest reason); the error to raise."""
        reason = pg_message(e)
        with self._lock:
            outage = self.down.get(name)
            if outage is None:
                self.down[name] = Outage(reason, time.monotonic() + self.probe_every)
            else:
                outage.reason = reason
        if outage is None:
            for callback in self._tripped:
                callback(name)
        return self.error(name)

    def admit(self, name: str) -> bool:
        """For a call to a database found down (name in down): True when it is this call's turn to probe (probe()
        next), False when the breaker closed meanwhile; else DatabaseUnavailableError, at once."""
        now = time.monotonic()
        with self._lock:
            outage = self.down.get(name)
            if outage is None:
                return False
            turn = not outage.probing and now >= outage.next_probe
            if turn:
                outage.probing = True
                outage.next_probe = now + self.probe_every
        if not turn:
            raise self.error(name)
        return True

    def probe(self, name: str) -> None:
        """The call admit() let through: one connect; the breaker closes if it works, else the call fails as the
        others do."""
        self.stats["probes"] = self.stats.get("probes", 0) + 1
        try:
            self._reach(name)
        except BaseException as e:
            with self._lock:
                outage = self.down.get(name)
                if outage is not None:
                    outage.probing = False
                    if isinstance(e, psycopg.Error):
                        outage.reason = pg_message(e)
            if isinstance(e, psycopg.Error):
                raise self.error(name) from None
            raise
        with self._lock:
            self.down.pop(name, None)

    def let_through(self, name: str) -> None:
        """admit(), then probe() if it is this call's turn (sync callers; the AsyncRouter probes off its loop)."""
        if self.admit(name):
            self.probe(name)

    def lost(self, name: str, e: BaseException | None = None) -> DatabaseUnavailableError | None:
        """After a connection to name broke (or could not be made, with e, if went_away(e)): whether the database
        answers now, found by one connect (as long as the connect timeout at most). DatabaseUnavailableError, the
        breaker open, if it does not; None if it does (the error was that connection's alone: a restart, a pooler
        or an idle timeout)."""
        if name in self.down:
            return self.error(name)
        if e is not None and not went_away(e):
            return None
        try:
            self._reach(name)
        except psycopg.Error as failed:
            return self.trip(name, failed)
        return None


__all__ = ["CONNECT_TIMEOUT", "PROBE_EVERY", "Breaker", "Outage", "no_answer", "went_away"]
