"""A move to a server whose clock is 10 s behind the source's (started under libfaketime)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from movekit import Writer, leftovers
from moveshards import setup_shards

from pgidgen import sandbox
from pgidgen.config import Config
from pgidgen.move import move_shard, move_shards

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture(scope="module")
def behind_dsn() -> Iterator[str]:
    if not Path(LIBFAKETIME).exists():
        pytest.skip("libfaketime is not installed")
    root = sandbox.make_root()
    server = None
    try:
        server = sandbox.create_server(root, "behind", env={"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "-10s"},
                                       settings={"wal_retrieve_retry_interval": "'100ms'"})
        dbname = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{dbname}"')
        yield server.dsn.rsplit("/", 1)[0] + "/" + dbname
    finally:
        sandbox.destroy([server] if server else [], root)


def test_move_to_a_server_10s_behind(config: Config, behind_dsn: str) -> None:
    cfg = Config(layout=config.layout, databases={**config.databases, "behind": behind_dsn})
    with psycopg.connect(behind_dsn, autocommit=True) as c:
        lag_s = time.time() - c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    assert 9 < lag_s < 11, f"the faketime server should be 10 s behind, is {lag_s:.1f} s"
    setup_shards(cfg, rows=50)
    writer = Writer(cfg.databases, 1)
    writer.start()
    time.sleep(0.3)
    report = move_shard(cfg, 1, "behind")
    moved_at_ms = int(time.time() * 1000)
    n_at = len(writer.ids)
    time.sleep(0.3)
    writer.stop()
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert report.skew_ms is not None and -11000 < report.skew_ms < -9000
    ids = writer.ids
    assert len(ids) > n_at > 0
    assert len(set(ids)) == len(ids), "no duplicate ID"
    assert ids == sorted(ids), "IDs keep increasing across the move to a slower clock"
    with psycopg.connect(behind_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM shard_1.t").fetchone()[0] == 50 + len(ids)
        # the generator was carried past the source's clock at the flip, not just past its last ID
        first_after = c.execute("SELECT pgidgen.id_time(shard_1.next_id())").fetchone()[0]
    assert first_after.timestamp() * 1000 >= moved_at_ms - 1000
    # an idle shard: its last ID is old, and the target's own clock is 10 s late; its first new ID must still
    # not be older than the moment of the move as the source's clock saw it
    with psycopg.connect(cfg.dsn("db1"), autocommit=True) as c:
        last2 = c.execute("SELECT pgidgen.last_id(2)").fetchone()[0]
    time.sleep(0.5)
    before_ms = time.time() * 1000
    move_shard(cfg, 2, "behind")
    with psycopg.connect(behind_dsn, autocommit=True) as c:
        new_id, new_time = c.execute("SELECT i, pgidgen.id_time(i) FROM (SELECT shard_2.next_id() AS i) x").fetchone()
    assert new_id > last2
    assert new_time.timestamp() * 1000 >= before_ms - 50
    assert leftovers(cfg.databases) == []


def test_a_batch_to_a_server_10s_behind_carries_every_shards_generator(config: Config, behind_dsn: str) -> None:
    """The slow-clock rule for each shard of a batch: the written one and the idle ones alike."""
    dbname = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(behind_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{dbname}"')
    behind = behind_dsn.rsplit("/", 1)[0] + "/" + dbname
    cfg = Config(layout=config.layout, databases={**config.databases, "behind": behind})
    setup_shards(cfg, rows=20)
    with psycopg.connect(cfg.dsn("db1"), autocommit=True) as c:
        last = {s: c.execute("SELECT pgidgen.last_id(%s)", (s,)).fetchone()[0] for s in range(4)}
    writer = Writer(cfg.databases, 1)
    writer.start()
    time.sleep(0.3)
    before_ms = time.time() * 1000
    [report] = move_shards(cfg, [0, 1, 2, 3], "behind")
    time.sleep(0.3)
    writer.stop()
    assert report.shards == [0, 1, 2, 3] and report.verification is not None and report.verification.ok
    assert report.skew_ms is not None and -11000 < report.skew_ms < -9000
    ids = writer.ids
    assert ids and len(set(ids)) == len(ids) and ids == sorted(ids), "IDs keep increasing across the batch's move to a slower clock"
    with psycopg.connect(behind, autocommit=True) as c:
        for s in (0, 2, 3):  # idle: their first new ID is past their last and not older than the move on the source's clock
            new_id, new_time = c.execute(f"SELECT i, pgidgen.id_time(i) FROM (SELECT shard_{s}.next_id() AS i) x").fetchone()
            assert new_id > last[s] and new_time.timestamp() * 1000 >= before_ms - 50, s
    assert leftovers(cfg.databases) == []
