"""Locks taken on live tables with a short lock_timeout, retried: an application query never queues behind
pgidgen for longer than the timeout, and the session that held the lock is named."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from pgidgen.lockwait import Holder, LockPolicy, LockWaitExceeded, with_lock_retries

ALTER = "ALTER TABLE s.t ADD COLUMN IF NOT EXISTS note text"


@pytest.fixture
def dsn(fresh_dsns: dict[str, str]) -> str:
    with psycopg.connect(fresh_dsns["db1"], autocommit=True) as conn:
        conn.execute("CREATE SCHEMA s; CREATE TABLE s.t (id int PRIMARY KEY); INSERT INTO s.t SELECT generate_series(1, 100)")
    return fresh_dsns["db1"]


class Reader:
    """The application: `SELECT count(*)` on the table again and again; the longest any of them took."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.stop = threading.Event()
        self.longest = 0.0
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            self.conn.execute("SELECT count(*) FROM s.t")
            self.longest = max(self.longest, time.monotonic() - t0)
            time.sleep(0.01)

    def __enter__(self) -> Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.conn.close()


@pytest.fixture
def blocker(dsn: str) -> Iterator[psycopg.Connection[tuple[int]]]:
    """A report's open transaction that has read the table (ACCESS SHARE held until it ends)."""
    conn = psycopg.connect(dsn, application_name="monthly report")
    conn.execute("SELECT count(*) FROM s.t")
    try:
        yield conn
    finally:
        conn.close()


def test_a_migration_that_cannot_get_its_lock_never_queues_the_application(dsn: str, blocker: psycopg.Connection[tuple[int]]) -> None:
    waits: list[tuple[list[Holder], float]] = []
    with Reader(dsn) as reader, psycopg.connect(dsn) as conn:
        with pytest.raises(LockWaitExceeded) as caught:
            with_lock_retries(conn, lambda c: c.execute(ALTER), schemas=["s"], where="db1, shard s",
                              policy=LockPolicy(lock_timeout=0.1, wait=1.5), on_wait=lambda h, s: waits.append((h, s)))
        time.sleep(0.2)
    assert reader.longest < 0.1 + 0.5, f"the application waited {reader.longest:.2f} s behind a 0.1 s lock_timeout"
    pid = blocker.info.backend_pid
    message = caught.value.render()
    # the seconds it waited: 1.5 s and a try's lock_timeout, more on a loaded machine
    assert re.match(rf"gave up after \d+ s waiting for a lock held by pid {pid} \(monthly report\), transaction open ", message), message
    assert message.endswith("s: SELECT count(*) FROM s.t (db1, shard s): end or wait for that transaction (pg_terminate_backend(pid)"
                            " ends it), then run again: what was applied stays applied"), message
    assert len(waits) >= 3 and all(h[0].pid == pid for h, _ in waits)
    with psycopg.connect(dsn) as check:  # nothing was applied, nothing waits
        assert check.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 's.t'::regclass AND attname = 'note'").fetchone() == (0,)


def test_without_the_timeout_the_application_queues(dsn: str, blocker: psycopg.Connection[tuple[int]]) -> None:
    """What the test above guards against, measured the same way: a plain ALTER queues the reader behind it."""
    with Reader(dsn) as reader, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '1500ms'")  # the plain ALTER, bounded so the test ends
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute(ALTER)
    assert reader.longest > 1.0


def test_the_migration_runs_once_the_lock_is_let_go(dsn: str, blocker: psycopg.Connection[tuple[int]]) -> None:
    threading.Timer(0.6, blocker.rollback).start()
    waits: list[float] = []
    with psycopg.connect(dsn) as conn:
        with_lock_retries(conn, lambda c: c.execute(ALTER), schemas=["s"], where="db1", policy=LockPolicy(lock_timeout=0.1, wait=30),
                          on_wait=lambda h, s: waits.append(s))
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 's.t'::regclass AND attname = 'note'").fetchone() == (1,)
    assert waits, "it never had to wait"
