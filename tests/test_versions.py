"""Across PostgreSQL majors: moves from every older supported major up to 18 (and 15 -> 16) under a writer, a
downward move that works and one that is refused before anything is written, drift between majors.

Each test starts the majors it needs (conftest's pg_major_server: PostgreSQL 15-18); CI runs them once.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from conftest import TestServer, fresh_database
from movekit import Writer, leftovers

from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.ddl.drift import read_drift, schema_items
from pgidgen.init import init
from pgidgen.layout import Layout
from pgidgen.move import MoveError, move_shard, resume_move, rollback_move

pytestmark = pytest.mark.versions

SHARDS = 4

#: A shard's schema that every supported major can hold: NOT NULL columns (constraint rows on 18 only), checks,
#: a foreign key, an enum, a view, a function, an index, a serial.
SCHEMA = """
CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE {s}.t (id bigint PRIMARY KEY DEFAULT {s}.next_id(), v int NOT NULL, note text CHECK (note <> ''), m {s}.mood);
CREATE TABLE {s}.likes (id bigserial PRIMARY KEY, t_id bigint NOT NULL REFERENCES {s}.t (id) ON DELETE CASCADE, at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON {s}.likes (t_id, at);
CREATE VIEW {s}.busy AS SELECT t_id, count(*) AS n FROM {s}.likes GROUP BY t_id;
CREATE FUNCTION {s}.double(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT x * 2';
INSERT INTO {s}.t (v, note, m) SELECT g, 'n' || g, 'ok' FROM generate_series(1, 300) g;
INSERT INTO {s}.likes (t_id) SELECT id FROM {s}.t WHERE v % 3 = 0;
"""


@pytest.fixture
def two_majors(pg_major_server: Callable[[int], TestServer], request: pytest.FixtureRequest) -> Iterator[Config]:
    """A config with db1 on the first major of the test's `majors` parameter and db2 on the second."""
    src_major, tgt_major = request.param
    src, tgt = pg_major_server(src_major), pg_major_server(tgt_major)
    for s in (src, tgt):
        with psycopg.connect(s.dsn, autocommit=True) as c:  # 15-17 start subscriptions at most every 5 s otherwise
            c.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'")
            c.execute("SELECT pg_reload_conf()")
    a, b = fresh_database(src), fresh_database(tgt)
    try:
        yield Config(layout=Layout.make(), databases={"db1": next(a), "db2": next(b)})
    finally:
        for gen in (a, b):
            gen.close()


def _setup(config: Config) -> None:
    outcomes = init(config, SHARDS, ["db1"])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for shard in range(SHARDS):
            c.execute(SCHEMA.format(s=f"shard_{shard}").encode())


def _ids(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(f"SELECT id FROM {schema}.t ORDER BY id")]


def _version(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.info.server_version // 10000


UPWARD = [(15, 18), (16, 18), (17, 18), (15, 16), (16, 17)]


@pytest.mark.parametrize("two_majors", UPWARD, ids=[f"{a}to{b}" for a, b in UPWARD], indirect=True)
def test_move_up_a_major_under_a_writer(two_majors: Config) -> None:
    config = two_majors
    _setup(config)
    before = _ids(config.dsn("db1"), "shard_1")
    writer = Writer(config.databases, 1)
    writer.start()
    time.sleep(0.3)
    report = move_shard(config, 1, "db2")
    time.sleep(0.3)
    writer.stop()
    assert report.status == "done", report.lines()
    assert report.pause_ms is not None and report.pause_ms < 1000
    assert report.verification is not None and report.verification.ok
    ids = writer.ids
    assert ids and len(set(ids)) == len(ids) and ids == sorted(ids), "no duplicate, IDs only ever grew"
    assert set(_ids(config.dsn("db2"), "shard_1")) == set(before) | set(ids), "nothing lost"
    # the generator state came along: the target's next ID is above everything written on the source
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        assert c.execute("INSERT INTO shard_1.t (v) VALUES (0) RETURNING id").fetchone()[0] > max(ids)
        assert c.execute("INSERT INTO shard_1.likes (t_id) VALUES (%s) RETURNING id", (ids[-1],)).fetchone()[0] > 100
    # the same schema by meaning on both majors (NOT NULL constraint rows on 18, MAINTAIN for owners on 17+)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as s, psycopg.connect(config.dsn("db2"), autocommit=True) as t:
        retired = {i for i in schema_items(s, report.retired_schema) if "pgidgen_retired" not in i}  # its write guards
        assert retired == schema_items(t, "shard_1")
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("two_majors", [(15, 18)], ids=["15to18"], indirect=True)
def test_across_majors_a_crashed_move_resumes_and_rolls_back(two_majors: Config) -> None:
    config = two_majors
    _setup(config)

    class Crash(Exception):
        pass

    def crash_at(point: str) -> Callable[[str], None]:
        def hook(where: str) -> None:
            if where == point:
                raise Crash(point)
        return hook

    with pytest.raises(Crash):
        move_shard(config, 2, "db2", hook=crash_at("catchup"))
    assert rollback_move(config, 2).status == "rolled_back"
    assert leftovers(config.databases) == []
    with pytest.raises(Crash):
        move_shard(config, 2, "db2", hook=crash_at("cutover:frozen"))
    report = resume_move(config, 2)
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("two_majors", [(18, 15)], ids=["18to15"], indirect=True)
def test_move_down_a_major(two_majors: Config) -> None:
    """A shard that uses nothing 15 lacks moves down; one with an 18-only column (VIRTUAL generated) is refused
    before anything is journaled, created or locked."""
    config = two_majors
    _setup(config)
    report = move_shard(config, 1, "db2")
    assert report.status == "done" and report.verification is not None and report.verification.ok
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("ALTER TABLE shard_2.t ADD COLUMN v2 int GENERATED ALWAYS AS (v * 2) VIRTUAL")
        moves_before = c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0]
    with pytest.raises(MoveError) as refused:
        move_shard(config, 2, "db2")
    text = refused.value.render()
    assert "\n" not in text and "PostgreSQL 15" in text and "shard_2" in text, text
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == moves_before, "nothing journaled"
        assert c.execute("SELECT state FROM pgidgen.shards WHERE shard = 2").fetchone()[0] == "active"
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('shard_2')").fetchone()[0] is None
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("two_majors", [(15, 18)], ids=["15and18"], indirect=True)
def test_no_drift_between_majors(two_majors: Config, tmp_path: Any) -> None:
    """Shards made the same way on 15 and on 18 do not drift (18's NOT NULL constraint rows, 17's MAINTAIN)."""
    config = two_majors
    outcomes = init(config, SHARDS, ["db1", "db2"])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    path = tmp_path / "schema.sql"
    path.write_text("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id(), v int NOT NULL, note text CHECK (note <> ''));\n"
                    "CREATE TABLE likes (t_id bigint NOT NULL REFERENCES t (id), at timestamptz NOT NULL DEFAULT now());\n")
    cfg = tmp_path / "pgidgen.toml"
    write_config(cfg, config.layout, config.databases)
    r = CliRunner().invoke(main, ["--config", str(cfg), "apply-ddl", str(path)])
    assert r.exit_code == 0, r.output
    drift = read_drift(config)
    assert drift.problems == [], drift.problems
    assert {_version(config.dsn("db1")), _version(config.dsn("db2"))} == {15, 18}


@pytest.mark.parametrize("two_majors", [(18, 17)], ids=["18to17"], indirect=True)
def test_a_pg_dump_older_than_the_source_is_refused_before_anything_is_journaled(
    two_majors: Config, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client programs are found and checked up front; only their version is read here (`--version`), so a
    directory of programs that print an older version stands in for an older installation."""
    config = two_majors
    _setup(config)
    old = tmp_path / "pg15bin"
    old.mkdir()
    for program in ("pg_dump", "pg_restore", "psql"):
        (old / program).write_text(f"#!/bin/sh\necho '{program} (PostgreSQL) 15.4'\n")
        (old / program).chmod(0o755)
    monkeypatch.setenv("PGIDGEN_CLIENT_BINDIR", str(old))
    expected = ("Error: pg_dump 15.4 (PGIDGEN_CLIENT_BINDIR) cannot dump a PostgreSQL 18 server (db1): install PostgreSQL 18's"
                " or a newer client (pip install 'pgidgen[sandbox]' brings 18's), or set PGIDGEN_CLIENT_BINDIR to one\n")
    cfg = tmp_path / "pgidgen.toml"
    write_config(cfg, config.layout, config.databases)
    r = CliRunner().invoke(main, ["--config", str(cfg), "move-shard", "1", "db2"])
    assert (r.exit_code, r.output) == (1, expected)
    r = CliRunner().invoke(main, ["--config", str(cfg), "rebalance"])
    assert (r.exit_code, r.output) == (1, expected)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None, "nothing written on the target"
    assert leftovers(config.databases) == []
