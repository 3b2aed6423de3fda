"""Locks on live tables that never queue the application behind pgidgen.

PostgreSQL queues lock requests: an ALTER TABLE waiting for one long read makes every later query on that table wait
behind the ALTER, so a migration that waits stalls the application. Here every such transaction runs with a short
`lock_timeout`; when it cannot get a lock in time it rolls back (releasing what it held, so nothing queues behind
it), sleeps with backoff and jitter, and tries again, until a deadline (GitLab's WithLockRetries, with the last try
refused rather than waiting unbounded). What held the lock is read each time it fails, so the error at the deadline
(and the progress before it) names the session to look at: pid, application_name, how long its transaction has
been open, and the first words of its query.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors

from .errors import DatabaseError

T = TypeVar("T")

#: sessions (not pgidgen's own) holding a lock on a relation in the given schemas, the oldest transaction first
HOLDERS_SQL = """
SELECT a.pid, coalesce(a.application_name, ''), extract(epoch FROM pg_catalog.now() - a.xact_start)::float8,
       pg_catalog.left(pg_catalog.regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 60), pg_catalog.min(n.nspname)
FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_class c ON c.oid = l.relation
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
  AND n.nspname = ANY(%s) AND l.pid <> pg_catalog.pg_backend_pid()
GROUP BY 1, 2, 3, 4
ORDER BY 3 DESC NULLS LAST, 1
"""


@dataclass(frozen=True)
class Holder:
    """A session holding a lock pgidgen waited for."""

    pid: int
    application_name: str
    open_s: float | None
    query: str
    schema: str

    def describe(self) -> str:
        app = f" ({self.application_name})" if self.application_name else ""
        age = f", transaction open {self.open_s:.0f} s" if self.open_s is not None else ""
        return f"pid {self.pid}{app}{age}: {self.query or '(no query)'}"


@dataclass(frozen=True)
class LockPolicy:
    """lock_timeout: the most one try waits for a lock (so the most an application query waits behind it);
    wait: how long the tries go on before giving up (--lock-wait)."""

    lock_timeout: float = 0.2
    wait: float = 180.0
    first_sleep: float = 0.05
    max_sleep: float = 5.0

    def sleeps(self) -> Callable[[], float]:
        """The pause after each failed try: doubling from first_sleep to max_sleep, each with +-50% jitter (so the
        tries of parallel workers do not fall into step with the application's queries)."""
        state = {"next": self.first_sleep}

        def take() -> float:
            base = state["next"]
            state["next"] = min(self.max_sleep, base * 2)
            return base * random.uniform(0.5, 1.5)

        return take


class LockWaitExceeded(DatabaseError):
    """The deadline passed while a session kept the lock; the line names it."""


def holders(conn: psycopg.Connection[Any], schemas: Sequence[str]) -> list[Holder]:
    """Who holds locks in these schemas now (read on an autocommit or idle connection)."""
    rows = conn.execute(HOLDERS_SQL, (list(schemas),)).fetchall()
    return [Holder(int(r[0]), str(r[1]), None if r[2] is None else float(r[2]), str(r[3]), str(r[4])) for r in rows]


def with_lock_retries(
    conn: psycopg.Connection[Any],
    work: Callable[[psycopg.Connection[Any]], T],
    *,
    schemas: Sequence[str],
    policy: LockPolicy | None = None,
    where: str,
    on_wait: Callable[[list[Holder], float], None] | None = None,
) -> T:
    """work(conn) in a transaction of its own under policy.lock_timeout, again after each lock timeout (55P03),
    until policy.wait has passed; then LockWaitExceeded naming the sessions that held locks in schemas. conn must
    be idle (autocommit off or on: the transaction is this function's). on_wait(holders, seconds waited so far)
    after each failed try, for progress. Any other error is raised as it is, the transaction rolled back."""
    p = policy or LockPolicy()
    deadline = time.monotonic() + p.wait
    sleep = p.sleeps()
    seen: list[Holder] = []
    start = time.monotonic()
    while True:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{max(1, round(p.lock_timeout * 1000))}ms'".encode())
                return work(conn)
        except pgerrors.LockNotAvailable:
            seen = holders(conn, schemas) or seen
            if on_wait is not None:
                on_wait(seen, time.monotonic() - start)
            pause = sleep()
            if time.monotonic() + pause > deadline:
                who = "; ".join(h.describe() for h in seen[:3]) or "a session that has since let go"
                raise LockWaitExceeded(
                    f"gave up after {time.monotonic() - start:.0f} s waiting for a lock held by {who}", where=where,
                    hint="end or wait for that transaction (pg_terminate_backend(pid) ends it), then run again: what was applied stays applied",
                ) from None
            time.sleep(pause)
