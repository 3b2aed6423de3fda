"""The claim lock against a real batch move (pgidgen/routing/__init__.py has the argument): the cutover waits
for a routed transaction that claimed one of the batch's shards even before it touched a table (the tables'
locks alone would not wait for it), and a claim that waited on the cutover's lock of another of its shards sees
the flip and writes nothing."""
from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from moveshards import quick_subscription_start, rows_of, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen.config import Config
from pgidgen.move import MoveOptions, move_shards

BATCH = [0, 1, 2, 3]  # setup_shards: db1 holds 0-3 with tables


def _lock_waiters(dsn: str, n: int, timeout: float = 20.0) -> None:
    """Until n sessions of dsn's database wait for an advisory lock (the claim lock)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = current_database()").fetchone()[0] < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {n} sessions wait for an advisory lock")
            time.sleep(0.005)


def test_a_batch_cutover_waits_for_a_claim_made_before_it_and_stops_one_made_during_it(config: Config) -> None:
    setup_shards(config)
    db1 = config.dsn("db1")
    out: dict[str, Any] = {}
    threads: list[threading.Thread] = []

    def claimed_writer() -> None:
        """Claimed shard 2 before the cutover, writes only once the cutover waits for it."""
        try:
            with psycopg.connect(db1) as c:
                c.execute("SELECT pgidgen.claim_shard(2)")
                out["claimed 2"] = True
                _lock_waiters(db1, 1)  # the freeze: it holds shards 0 and 1 and waits for 2
                t = threading.Thread(target=late_claim)
                threads.append(t)
                t.start()
                _lock_waiters(db1, 2)  # and the late claim of shard 0 waits for the freeze
                out["id"] = c.execute("INSERT INTO shard_2.t (v, note) VALUES (1, 'claimed before the freeze') RETURNING id").fetchone()[0]
            out["committed"] = True
        except BaseException as e:  # noqa: BLE001 - reported by the assertions
            out["writer error"] = e

    def late_claim() -> None:
        try:
            with psycopg.connect(db1) as c:
                c.execute("SELECT pgidgen.claim_shard(0)")
                c.execute("INSERT INTO shard_0.t (v, note) VALUES (2, 'claimed during the freeze')")
            out["late committed"] = True
        except psycopg.Error as e:
            out["late sqlstate"] = e.sqlstate

    def hook(where: str) -> None:
        if where == "cutover":
            t = threading.Thread(target=claimed_writer)
            threads.append(t)
            t.start()
            deadline = time.monotonic() + 20
            while "claimed 2" not in out and "writer error" not in out and time.monotonic() < deadline:
                time.sleep(0.005)

    reports = move_shards(config, BATCH, "db3", options=MoveOptions(max_pause=10.0, attempts=1), hook=hook)
    for t in list(threads):
        t.join(20)
    assert "writer error" not in out, out
    assert len(reports) == 1 and reports[0].status == "done"
    assert out.get("committed") and out.get("late sqlstate") == "PGR01" and "late committed" not in out, out
    assert (out["id"], 1, "claimed before the freeze") in rows_of(config.dsn("db3"), "shard_2")  # the move carried it
    assert not [r for r in rows_of(config.dsn("db3"), "shard_0") if r[2] == "claimed during the freeze"]
    for s in BATCH:
        assert state_of(config.dsn("db3"), s) == ("active", f"shard_{s}")
