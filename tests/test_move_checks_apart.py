"""What a move's start runs beside its checks (the target's login probe, check_batch, the schema's pg_dump, the
target's connection) when a check refuses the move: nothing journaled or written anywhere, no thread, connection
or child process left behind, and the first refusal the one the checks gave before they ran side by side; the
row relay's 1 MB blocks (memoryviews handed to libpq) arrive intact."""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import psycopg
import pytest
from movekit import leftovers
from moveshards import POINTS, Crash, crash_at, quick_subscription_start, rows_of, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen import pgbin
from pgidgen.config import Config
from pgidgen.errors import SandboxError
from pgidgen.move import MoveError, MoveOptions, move_shard, resume_move, rollback_move


def _children() -> list[str]:
    """This process's child processes (pg_dump, psql) by name."""
    me, out = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[1] == me:
            out.append(name)
    return out


def _pgidgen_sessions(dsns: dict[str, str]) -> list[tuple[Any, ...]]:
    """Sessions of pgidgen's own connections (application_name pgidgen) on the servers of dsns, once those
    closed have ended (a backend leaves pg_stat_activity a moment after its client closed the connection)."""
    found: list[tuple[Any, ...]] = []
    for _ in range(100):
        found = []
        for dsn in set(dsns.values()):
            with psycopg.connect(dsn, autocommit=True) as c:
                found += c.execute("SELECT datname, backend_type, state, left(query, 80) FROM pg_stat_activity"
                                   " WHERE application_name = 'pgidgen' AND pid <> pg_backend_pid()").fetchall()
        if not found:
            break
        time.sleep(0.05)
    return found


def _nothing_left(config: Config, threads: set[threading.Thread]) -> None:
    assert set(threading.enumerate()) == threads, "a thread of the refused move outlived it"
    assert _children() == [], "a child process of the refused move outlived it"
    assert _pgidgen_sessions(config.databases) == [], "a connection of the refused move is still open"
    assert leftovers(config.databases) == []
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0, "nothing journaled"
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen') IS NULL AND to_regnamespace('shard_1') IS NULL").fetchone()[0], \
            "nothing written on the target"
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")


@pytest.mark.parametrize("refusal", ["table", "batch", "table, probe hanging"])
def test_a_refusal_beside_the_probe_leaves_nothing(config: Config, refusal: str) -> None:
    """A fresh target (no pgidgen catalog): the move is refused by check_tables (on this thread, while the
    probe, check_batch and pg_dump run) or by check_batch (on its own connections); the probe's subscription,
    pg_dump, the threads and their connections are all gone when move_shard raises. probe hanging: the
    subscription's login goes to a port that accepts and never answers, so the refusal comes while the probe
    waits (stopped by a cancel, not left to time out behind the move)."""
    setup_shards(config, rows=20, databases=("db1",))
    options = MoveOptions()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    if "probe hanging" in refusal:
        options.subscription_conninfo = f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=app user=postgres connect_timeout=60"
        refusal = "table"
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        if refusal == "table":
            c.execute("CREATE TABLE shard_1.nokey (v int, doc json)")
        else:
            c.execute("CREATE VIEW public.outside AS SELECT id FROM shard_1.t")
    threads = set(threading.enumerate())
    expected = "has no primary key or unique index on NOT NULL columns" if refusal == "table" else "depend on it and cannot move with it"
    try:
        with pytest.raises(MoveError, match=expected):
            move_shard(config, 1, "db3", options=options)
        _nothing_left(config, threads)
    finally:
        silent.close()
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS shard_1.nokey")
        c.execute("DROP VIEW IF EXISTS public.outside")
    report = move_shard(config, 1, "db3")
    assert report.verification is not None and report.verification.ok


@pytest.mark.parametrize("point", ["prepare", "publication"])
def test_the_first_refusal_is_the_interrupted_move_before_the_clients(config: Config, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """An interrupted move of the shard is named before missing client tools, as before the checks ran beside
    the early pg_dump (prepare: the shard is still 'active' on the source, only the journal has the move).
    locate_batch finds it first; the move's own checks, after the lock, keep that order too (they had the
    clients first: seen with locate_batch's check taken out)."""
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", hook=crash_at(point))

    def no_clients(server_major: int) -> Any:
        raise SandboxError(f"pg_dump 1 cannot dump a PostgreSQL {server_major} server", hint="install newer client tools")

    monkeypatch.setattr(pgbin, "clients_for", no_clients)
    with pytest.raises(MoveError, match="an interrupted move of shard 1 to db3 exists"):
        move_shard(config, 1, "db3")
    monkeypatch.undo()
    assert rollback_move(config, 1).status == "rolled_back"
    assert leftovers(config.databases) == []


def test_rows_of_many_relay_blocks_arrive_intact(config: Config) -> None:
    """A table well over INLINE_BYTES goes through psql's stream and the relay's 1 MB blocks (memoryviews of
    each block handed to libpq): every row arrives as it was, in a copy of several blocks."""
    setup_shards(config, rows=20)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.big (id bigint PRIMARY KEY, payload text, b bytea)")
        c.execute("INSERT INTO shard_1.big SELECT g, repeat(md5(g::text), 3), decode(md5((g * 7)::text), 'hex')"
                  " FROM generate_series(1, 40000) g")
        c.execute("ANALYZE shard_1.big")
    expected = rows_of(config.dsn("db1"), "shard_1", "big")
    report = move_shard(config, 1, "db3")
    assert report.bytes_copied > 4 << 20, report.bytes_copied  # several of the relay's 1 MB blocks
    assert report.verification is not None and report.verification.ok
    assert rows_of(config.dsn("db3"), "shard_1", "big") == expected


def test_a_probe_stopped_while_it_connects_does_not_probe(config: Config) -> None:
    """engine.Probe stopped before its own connection to the target is up (a check refused the move that soon):
    the target's server never tries the subscription's login (here to a port that would hold it until
    connect_timeout), rather than the stop waiting for a probe its cancel came too early to reach."""
    from pgidgen.move.engine import Probe

    setup_shards(config, rows=1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent.setblocking(False)
    try:
        threads = set(threading.enumerate())
        probe = Probe("db3", config.dsn("db3"), f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=app user=postgres connect_timeout=5")
        probe.stop()
        assert set(threading.enumerate()) == threads
        with pytest.raises(BlockingIOError):
            silent.accept()  # nobody came
        assert _pgidgen_sessions(config.databases) == []
    finally:
        silent.close()


@pytest.mark.parametrize("point", POINTS)
def test_a_move_stopped_at_any_step_leaves_no_thread_child_or_connection(config: Config, point: str) -> None:
    """A move that fails at any step (here: an exception at its crash-test point), to a fresh target whose
    catalog goes in on a thread from the prepare step: when move_shard raises, none of its threads, child
    processes or connections is left; its resume finishes the move, again leaving none."""
    setup_shards(config, rows=50, databases=("db1",))
    threads = set(threading.enumerate())
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", hook=crash_at(point))
    assert set(threading.enumerate()) == threads, "a thread of the failed move outlived it"
    assert _children() == []
    assert _pgidgen_sessions(config.databases) == []
    report = resume_move(config, 1)
    assert report.verification is not None and report.verification.ok
    assert set(threading.enumerate()) == threads
    assert _children() == []
    assert _pgidgen_sessions(config.databases) == []
    assert leftovers(config.databases) == []
