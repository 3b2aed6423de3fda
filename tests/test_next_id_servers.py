"""next_id() across server events, on a throwaway server of this module's own: the clock stepping back (the
server restarted under libfaketime), a crash in the middle of a burst (pg_ctl stop -m immediate), and a shard
continuing on a server whose clock is behind (pgidgen.last_id / pgidgen.advance_generator).
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgidgen import sandbox
from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout

LAYOUT = Layout.make(sequence_bits=3, shard_bits=8)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("PGIDGEN_TEST_DSNS")) or not os.path.exists(FAKETIME_LIB),
    reason="needs local throwaway servers and libfaketime (apt-get install faketime)",
)


def clock_env(offset: str | None) -> dict[str, str]:
    """Environment for a server whose clock is shifted by offset (libfaketime syntax, e.g. '-90s')."""
    if offset is None:
        return {}
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.fixture(scope="module")
def own_server() -> Iterator[sandbox.Server]:
    root = sandbox.make_root()
    server = sandbox.create_server(root, "own")
    try:
        yield server
    finally:
        sandbox.destroy([server], root)


def set_clock(server: sandbox.Server, offset: str | None, *, mode: str = "fast") -> None:
    sandbox.stop(server, mode=mode)
    sandbox.start(server, env=clock_env(offset))
    sandbox.wait_ready(server)


def fresh_db(server: sandbox.Server) -> str:
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = psycopg.conninfo.conninfo_to_dict(server.dsn)
    params["dbname"] = name
    return psycopg.conninfo.make_conninfo(**params)


def init_shards(dsn: str, count: int = 1) -> None:
    outcomes = init(Config(layout=LAYOUT, databases={"db": dsn}), count)
    assert all(o.ok for o in outcomes), outcomes


def server_skew_s(conn: psycopg.Connection[Any]) -> float:
    server = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
    return server - time.time()


def draw(conn: psycopg.Connection[Any], shard: int, *, burst: int, paced: int) -> list[int]:
    """A burst (ahead of the clock) and then paced calls (below 8 per ms: the offset is raised to the clock)."""
    ids = [r[0] for r in conn.execute(sql.SQL("SELECT {}.next_id() FROM generate_series(1, %s)").format(sql.Identifier(f"shard_{shard}")), (burst,))]
    for _ in range(paced):
        ids.append(conn.execute(sql.SQL("SELECT {}.next_id()").format(sql.Identifier(f"shard_{shard}"))).fetchone()[0])
        time.sleep(0.002)
    return ids


def assert_increasing(ids: list[int], what: str) -> None:
    bad = [(a, b) for a, b in pairwise(ids) if b <= a]
    assert not bad, f"{what}: {len(bad)} IDs not above their predecessor, e.g. {bad[:3]}"


def test_clock_stepping_back_seconds_and_minutes(own_server: sandbox.Server) -> None:
    set_clock(own_server, None)
    dsn = fresh_db(own_server)
    init_shards(dsn)
    seen: list[int] = []
    for offset, skew in ((None, 0.0), ("-5s", -5.0), ("-150s", -150.0)):
        if offset is not None:
            set_clock(own_server, offset)
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert abs(server_skew_s(conn) - skew) < 2.0, f"server clock not at {offset}"
            clock_ms = int(float(conn.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000").fetchone()[0]))
            ids = draw(conn, 0, burst=20_000, paced=30)
        assert_increasing(seen + ids, f"after the clock moved to {offset}")
        if seen:
            # The clock is behind the IDs already made: the time field keeps counting from there.
            assert LAYOUT.decode(ids[0])[0] > clock_ms
        seen += ids
    assert len(set(seen)) == len(seen)
    set_clock(own_server, None)


def test_crash_in_the_middle_of_a_burst(own_server: sandbox.Server) -> None:
    """Only IDs whose transaction committed count: they are never handed out again after the restart."""
    set_clock(own_server, None)
    dsn = fresh_db(own_server)
    init_shards(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id bigint PRIMARY KEY DEFAULT shard_0.next_id(), k int)")
    committed: list[list[int]] = [[], [], []]
    stop = threading.Event()
    started = threading.Barrier(4)

    def select_one(k: int) -> None:
        # Read-only transactions that draw one ID now and then, beside a burst that WAL-logs the counter: without
        # an XID their commit would not flush the WAL record covering their ID.
        with psycopg.connect(dsn, autocommit=True) as conn:
            started.wait()
            try:
                while not stop.is_set():
                    committed[k].append(conn.execute("SELECT shard_0.next_id()").fetchone()[0])
                    time.sleep(0.0005)
            except psycopg.OperationalError:
                pass

    def insert_rows() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            started.wait()
            try:
                while not stop.is_set():
                    committed[2].extend(r[0] for r in conn.execute("INSERT INTO public.t (k) SELECT g FROM generate_series(1, 20) g RETURNING id"))
                    time.sleep(0.02)
            except psycopg.OperationalError:
                pass

    def burst() -> None:  # never commits: its IDs may come again
        with psycopg.connect(dsn) as conn:
            started.wait()
            try:
                conn.execute("SELECT count(shard_0.next_id()) FROM generate_series(1, 100000000)")
            except psycopg.OperationalError:
                pass

    threads = [threading.Thread(target=select_one, args=(0,)), threading.Thread(target=select_one, args=(1,)),
               threading.Thread(target=insert_rows), threading.Thread(target=burst)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    sandbox.stop(own_server, mode="immediate")
    stop.set()
    for t in threads:
        t.join(timeout=60)
    sandbox.start(own_server)
    sandbox.wait_ready(own_server)
    before = [i for ids in committed for i in ids]
    assert all(committed), [len(c) for c in committed]
    for k, ids in enumerate(committed):
        assert_increasing(ids, f"session {k} before the crash")
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = {r[0] for r in conn.execute("SELECT id FROM public.t")}
        assert set(committed[2]) <= stored  # committed rows survived (synchronous_commit is on)
        after = draw(conn, 0, burst=5000, paced=10)
    assert len(set(before)) == len(before)
    assert min(after) > max(before), "an ID handed out before the crash came again"
    assert_increasing(after, "after the restart")



def _child_pid(server: sandbox.Server, title: str) -> int:
    postmaster = int(Path(server.datadir, "postmaster.pid").read_text().split()[0])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster and title in cmdline:
                return int(entry.name)
    raise AssertionError(f"no {title} process under postmaster {postmaster}")


def test_a_read_only_commit_waits_for_the_wal_of_its_id(own_server: sandbox.Server) -> None:
    """The WAL covering a counter value may have been written by another session (nextval logs 32 ahead), and
    PostgreSQL flushes at commit only what a transaction with an XID wrote itself. With the walwriter stopped,
    a committed `SELECT next_id()` whose value came from a burst's logged range, then a crash: the ID must not
    come again (it did, before next_id wrote a WAL record of its own in such transactions)."""
    set_clock(own_server, None)
    dsn = fresh_db(own_server)
    init_shards(dsn)
    with psycopg.connect(own_server.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET autovacuum = off")  # nothing else writes pages (and so flushes WAL) meanwhile
        conn.execute("SELECT pg_reload_conf()")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT shard_0.next_id()")
            conn.execute("CHECKPOINT")
        walwriter = _child_pid(own_server, "walwriter")
        os.kill(walwriter, signal.SIGSTOP)
        try:
            burst = psycopg.connect(dsn)  # logs the counter ahead and never commits
            burst.execute("SELECT count(shard_0.next_id()) FROM generate_series(1, 20000)")
            with psycopg.connect(dsn, autocommit=True) as reader:
                committed = [reader.execute("SELECT shard_0.next_id()").fetchone()[0] for _ in range(3)]
        finally:
            os.kill(walwriter, signal.SIGKILL)  # a crash: the postmaster restarts every process and recovers
        sandbox.wait_ready(own_server)
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    after = draw(conn, 0, burst=40000, paced=5)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the server did not come back after the crash"
                time.sleep(0.5)
        assert min(after) > max(committed), "an ID a committed transaction returned came again after the crash"
    finally:
        with psycopg.connect(own_server.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET autovacuum")
            conn.execute("SELECT pg_reload_conf()")

def test_a_shard_continues_on_a_server_whose_clock_is_behind(config: Config, own_server: sandbox.Server) -> None:
    source = config.dsn("db1")
    init_shards(source, 4)
    with psycopg.connect(source, autocommit=True) as conn:
        made = draw(conn, 2, burst=5000, paced=20)
        last = conn.execute("SELECT pgidgen.last_id(2)").fetchone()[0]
    assert last >= max(made)
    set_clock(own_server, "-120s")
    try:
        target = fresh_db(own_server)
        init_shards(target, 4)
        with psycopg.connect(target, autocommit=True) as conn:
            assert server_skew_s(conn) < -100
            # Without carrying the state across, the shard would repeat IDs it made on the first server.
            assert conn.execute("SELECT shard_2.next_id()").fetchone()[0] < max(made)
            conn.execute("SELECT pgidgen.advance_generator(2, %s)", (last,))
            moved = draw(conn, 2, burst=2000, paced=20)
            assert conn.execute("SELECT pgidgen.last_id(2)").fetchone()[0] >= max(moved)
        assert min(moved) > last
        assert_increasing(moved, "on the server whose clock is behind")
        assert {LAYOUT.decode(i)[1] for i in moved} == {2}
    finally:
        set_clock(own_server, None)
