"""apply-ddl's online files: CREATE INDEX / DROP INDEX CONCURRENTLY and VALIDATE CONSTRAINT run shard by shard
outside a transaction, each shard recorded; a killed build's invalid index is rebuilt by the next run (issue 32,
item 2)."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.ddl.apply import apply_ddl, read_file
from pgidgen.errors import PgidgenError
from pgidgen.init import init
from pgidgen.lockwait import LockPolicy

SHARDS = 6  # 0-2 on db1, 3-5 on db2
INDEX_SQL = ("SELECT n.nspname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n"
             " ON n.oid = c.relnamespace WHERE c.relname = 't_v_idx' ORDER BY 1")


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def each(config: Config, sql: str) -> list[Any]:
    out: list[Any] = []
    for name in ("db1", "db2"):
        with psycopg.connect(config.dsn(name)) as conn:
            out += conn.execute(sql).fetchall()
    return out


@pytest.fixture
def live(config: Config, config_file: Path, tmp_path: Path) -> Config:
    """Six shards with a table t of a few hundred rows, and the online files for it."""
    init(config, SHARDS, ["db1", "db2"])
    (tmp_path / "t.sql").write_text("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id(), v int);\n")
    assert cli(config_file, "apply-ddl", str(tmp_path / "t.sql")).exit_code == 0
    for name, shards in (("db1", (0, 1, 2)), ("db2", (3, 4, 5))):
        with psycopg.connect(config.dsn(name), autocommit=True) as conn:
            for s in shards:
                conn.execute(f"INSERT INTO shard_{s}.t (v) SELECT generate_series(1, 300)")
    (tmp_path / "idx.sql").write_text("CREATE INDEX CONCURRENTLY t_v_idx ON t (v);\n")
    (tmp_path / "drop.sql").write_text("DROP INDEX CONCURRENTLY t_v_idx;\n")
    return config


class Writer(threading.Thread):
    """The application: inserts into every shard's table, round robin, and keeps any error it meets."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config, self.stop, self.errors, self.rows = config, threading.Event(), list[str](), 0

    def run(self) -> None:
        conns = {n: psycopg.connect(self.config.dsn(n), autocommit=True) for n in ("db1", "db2")}
        try:
            while not self.stop.is_set():
                for s in range(SHARDS):
                    try:
                        conns["db1" if s < 3 else "db2"].execute(f"INSERT INTO shard_{s}.t (v) VALUES (7)")
                        self.rows += 1
                    except psycopg.Error as e:
                        self.errors.append(str(e))
        finally:
            for c in conns.values():
                c.close()


@pytest.fixture
def writer(live: Config) -> Iterator[Writer]:
    w = Writer(live)
    w.start()
    try:
        yield w
    finally:
        w.stop.set()
        w.join()


def ledger_rows(config: Config, position: int) -> int:
    return len(each(config, f"SELECT shard FROM pgidgen.ddl_ledger WHERE position = {position}"))


def test_an_index_is_built_concurrently_on_every_shard_under_a_writer(live: Config, config_file: Path, tmp_path: Path, writer: Writer) -> None:
    before = writer.rows
    res = cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"), "--jobs", "1")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[:2] == ["db1: applied idx.sql (#2) to 3 shards (0-2), shard by shard",
                                           "db2: applied idx.sql (#2) to 3 shards (3-5), shard by shard"]
    assert each(live, INDEX_SQL) == [(f"shard_{s}", True) for s in range(SHARDS)]
    assert ledger_rows(live, 2) == SHARDS
    time.sleep(0.2)
    assert writer.rows > before and writer.errors == []
    again = cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"))
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output
    (tmp_path / "reindex.sql").write_text("REINDEX INDEX CONCURRENTLY t_v_idx;\n")
    rebuilt = cli(config_file, "apply-ddl", str(tmp_path / "reindex.sql"))
    assert rebuilt.exit_code == 0, rebuilt.output
    assert each(live, INDEX_SQL) == [(f"shard_{s}", True) for s in range(SHARDS)] and ledger_rows(live, 3) == SHARDS
    dropped = cli(config_file, "apply-ddl", str(tmp_path / "drop.sql"))
    assert dropped.exit_code == 0, dropped.output
    assert each(live, INDEX_SQL) == [] and ledger_rows(live, 4) == SHARDS and writer.errors == []


@pytest.mark.parametrize("how", ["terminated", "deadline"])
def test_a_build_stopped_halfway_leaves_an_invalid_index_the_next_run_rebuilds(live: Config, config_file: Path, tmp_path: Path, how: str) -> None:
    """A session writing to one shard's table (picked at random) holds the build there after its index is in the
    catalog; the build is killed there, or gives up at --lock-wait: the index is left invalid, the next run drops it
    and builds it again."""
    shard = random.randrange(SHARDS)
    name = "db1" if shard < 3 else "db2"
    blocker = psycopg.connect(live.dsn(name), application_name="slow writer")
    blocker.execute(f"LOCK TABLE shard_{shard}.t IN ROW EXCLUSIVE MODE")  # a writer's lock, no snapshot kept
    pid = blocker.info.backend_pid
    waits: list[tuple[str, list[int], list[int]]] = []
    result: list[Any] = []
    policy = LockPolicy(wait=1.5 if how == "deadline" else 60)

    def run() -> None:
        try:
            result.append(apply_ddl(live, read_file(tmp_path / "idx.sql"), ["db1", "db2"], lock_policy=policy, jobs=1,
                                    on_lock_wait=lambda db, shards, who, s: waits.append((db, shards, [h.pid for h in who]))))
        except PgidgenError as e:
            result.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        if how == "terminated":
            with psycopg.connect(live.dsn(name), autocommit=True) as admin:
                for _ in range(200):
                    row = admin.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                        (pid,)).fetchone()
                    if row:
                        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                        break
                    time.sleep(0.05)
                else:
                    pytest.fail("the build never waited for the writer")
        thread.join(30)
    finally:
        blocker.rollback()
        blocker.close()
    outcome = {o.database: o for o in result[0].outcomes}
    assert not outcome[name].ok and outcome[name].error.startswith(f"database {name} failed in shard_{shard} at statement 1 (CREATE INDEX)"
                                                                   if how == "terminated" else "gave up after"), outcome[name].error
    if how == "deadline":
        assert f"waiting for older transactions held by pid {pid} (slow writer)" in outcome[name].error
        assert (name, [shard], [pid]) in waits  # said while it waited
    assert (f"shard_{shard}", False) in each(live, INDEX_SQL)  # the build's leftover
    assert ledger_rows(live, 2) < SHARDS
    again = cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"))
    assert again.exit_code == 0, again.output
    assert each(live, INDEX_SQL) == [(f"shard_{s}", True) for s in range(SHARDS)]  # one valid index per shard
    assert ledger_rows(live, 2) == SHARDS


def test_not_valid_then_validate_shard_by_shard(live: Config, config_file: Path, tmp_path: Path) -> None:
    with psycopg.connect(live.dsn("db1"), autocommit=True) as conn:
        conn.execute("INSERT INTO shard_1.t (v) VALUES (-1)")
    (tmp_path / "check.sql").write_text("ALTER TABLE t ADD CONSTRAINT t_v_positive CHECK (v > 0) NOT VALID;\n")
    (tmp_path / "validate.sql").write_text("ALTER TABLE t VALIDATE CONSTRAINT t_v_positive;\n")
    assert cli(config_file, "apply-ddl", str(tmp_path / "check.sql")).exit_code == 0
    res = cli(config_file, "apply-ddl", str(tmp_path / "validate.sql"))
    assert res.exit_code == 1
    assert res.stdout.splitlines()[0] == (
        "db1: failed: database db1 failed in shard_1 at statement 1 (ALTER TABLE) of validate.sql:1:1: check constraint \"t_v_positive\""
        " of relation \"t\" is violated by some row [SQLSTATE 23514]: shards 0 of db1 are done and recorded; run apply-ddl again to resume"
        " (an invalid index a build left is dropped and built again)")
    validated = "SELECT n.nspname, c.convalidated FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE conname = 't_v_positive' ORDER BY 1"
    assert each(live, validated) == [("shard_0", True), ("shard_1", False), ("shard_2", False)] + [(f"shard_{s}", True) for s in (3, 4, 5)]
    with psycopg.connect(live.dsn("db1"), autocommit=True) as conn:
        conn.execute("DELETE FROM shard_1.t WHERE v < 0")
    again = cli(config_file, "apply-ddl", str(tmp_path / "validate.sql"))
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines()[0] == "db1: applied validate.sql (#3) to 2 shards (1-2), shard by shard"
    assert each(live, validated) == [(f"shard_{s}", True) for s in range(SHARDS)] and ledger_rows(live, 3) == SHARDS


def test_a_file_mixing_online_and_transactional_statements_is_refused(config_file: Path, tmp_path: Path) -> None:
    f = tmp_path / "mixed.sql"
    f.write_text("CREATE INDEX CONCURRENTLY t_v_idx ON t (v);\nALTER TABLE t ADD COLUMN note text;\n")
    res = cli(config_file, "apply-ddl", str(f))
    assert res.exit_code == 1
    assert res.output == ("Error: mixed.sql mixes statement 1 (CREATE INDEX, line 1), which runs outside a transaction shard by shard, with"
                          " statement 2 (ALTER TABLE, line 2), which runs in one: split the file: one with the CONCURRENTLY statements"
                          " (and VALIDATE CONSTRAINT), one with the rest, applied one after the other\n")


def test_sql_shows_each_shards_online_statements(config_file: Path, tmp_path: Path) -> None:
    f = tmp_path / "idx.sql"
    f.write_text("CREATE INDEX CONCURRENTLY t_v_idx ON t (v);\n")
    res = cli(config_file, "apply-ddl", str(f), "--sql", "--shards", "4", "--databases", "db1")
    assert res.exit_code == 0, res.output
    assert "-- shard 1: idx.sql (#1), outside a transaction, statement by statement\nSET search_path = shard_1, pg_catalog, pg_temp;\n" in res.output
    assert "CREATE INDEX CONCURRENTLY t_v_idx ON shard_1.t (v);\nRESET search_path;\nINSERT INTO pgidgen.ddl_ledger" in res.output
    assert "BEGIN" not in res.output


def test_new_shards_get_an_online_file_as_a_plain_statement(live: Config, config_file: Path, tmp_path: Path) -> None:
    assert cli(config_file, "apply-ddl", str(tmp_path / "idx.sql")).exit_code == 0
    with psycopg.connect(live.dsn("db2"), autocommit=True) as conn:
        conn.execute("DROP SCHEMA shard_5 CASCADE")
        conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = 5")
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = 5")
    init(live, SHARDS, ["db1", "db2"])  # replays the ledger in init's transaction
    assert each(live, INDEX_SQL) == [(f"shard_{s}", True) for s in range(SHARDS)] and ledger_rows(live, 2) == SHARDS
