"""apply-ddl sizes its transactions from the server's lock table by itself: one transaction when the shards fit,
chunks the ledger resumes otherwise. On a real server with a small lock table (max_locks_per_transaction 10,
max_connections 20), where one transaction of all the shards runs out of shared memory."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from test_ddl import SCHEMA

from pgidgen import sandbox
from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.ddl.apply import apply_ddl, read_file
from pgidgen.init import init
from pgidgen.layout import Layout

SHARDS = 200


@pytest.fixture(scope="module")
def small_locks() -> Iterator[sandbox.Server]:
    root = sandbox.make_root()
    srv = sandbox.create_server(root, "locks", settings={"max_locks_per_transaction": "10", "max_connections": "20"})
    try:
        yield srv
    finally:
        sandbox.destroy([srv], root)


@pytest.fixture
def one_db(small_locks: sandbox.Server, tmp_path: Path) -> Iterator[tuple[Config, Path]]:
    dbname = "t_locks"
    with psycopg.connect(small_locks.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    params = psycopg.conninfo.conninfo_to_dict(small_locks.dsn)
    params["dbname"] = dbname
    config = Config(layout=Layout.make(), databases={"a": psycopg.conninfo.make_conninfo(**params)})
    path = tmp_path / "pgidgen.toml"
    write_config(path, config.layout, config.databases)
    yield config, path


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def with_tables(config: Config) -> int:
    with psycopg.connect(config.databases["a"], autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'likes' AND relkind = 'r'").fetchone()
    return int(row[0]) if row else 0


def test_too_many_shards_for_one_transaction_are_chunked_without_a_flag(one_db: tuple[Config, Path], tmp_path: Path) -> None:
    config, config_file = one_db
    init(config, SHARDS)
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    whole = cli(config_file, "apply-ddl", str(ddl), "--commit-every", str(SHARDS))  # what one transaction does here
    assert whole.exit_code == 1 and "out of shared memory" in whole.output and "SQLSTATE 53200" in whole.output, whole.output
    assert with_tables(config) == 0
    res = cli(config_file, "apply-ddl", str(ddl), "--json")
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)
    assert out["applied"] == SHARDS and out["transactions"] > 1
    assert out["summary"] == f"applied schema.sql (#1) to {SHARDS} shards (0-{SHARDS - 1}), in {out['transactions']} transactions"
    assert with_tables(config) == SHARDS
    assert cli(config_file, "status", "--drift").exit_code == 0


def test_chunks_stopped_by_an_error_resume_where_they_stopped(one_db: tuple[Config, Path], tmp_path: Path) -> None:
    config, config_file = one_db
    init(config, SHARDS)
    with psycopg.connect(config.databases["a"], autocommit=True) as conn:
        conn.execute("CREATE TABLE shard_151.likes (x int)")
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    res = cli(config_file, "apply-ddl", str(ddl))
    assert res.exit_code == 1
    assert 'relation "likes" already exists' in res.output and "it resumes where it stopped" in res.output, res.output
    done = with_tables(config) - 1
    assert 0 < done <= 151  # the chunks before shard 151 committed, the one with it rolled back
    with psycopg.connect(config.databases["a"], autocommit=True) as conn:
        conn.execute("DROP TABLE shard_151.likes")
    again = cli(config_file, "apply-ddl", str(ddl))
    assert again.exit_code == 0, again.output
    assert again.output.startswith(f"a: applied schema.sql (#1) to {SHARDS - done} shards ("), again.output
    assert with_tables(config) == SHARDS


def test_a_few_shards_stay_one_transaction(one_db: tuple[Config, Path], tmp_path: Path) -> None:
    config, config_file = one_db
    init(config, 3)
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    result = apply_ddl(config, read_file(ddl), atomic=True)
    (sizing,) = result.plan.sizing.values()
    assert (sizing.transactions, sizing.chunked) == (1, False)
    assert [o.summary for o in result.outcomes] == ["applied schema.sql (#1) to 3 shards (0-2)"]
    assert sizing.describe("a").startswith("a: 3 shards in one transaction (~")


def test_the_line_a_terminal_shows(one_db: tuple[Config, Path], tmp_path: Path) -> None:
    config, _ = one_db
    init(config, SHARDS)
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    result = apply_ddl(config, read_file(ddl), atomic=True)
    (sizing,) = result.plan.sizing.values()
    assert sizing.describe("a") == (
        f"a: {SHARDS} shards in {sizing.transactions} transactions of up to {sizing.per_tx}: ~{sizing.locks_per_shard} locks per shard"
        " and the server's lock table holds 200 (max_locks_per_transaction x connections); each commits with its ledger rows,"
        " so an interrupted run resumes where it stopped")


def test_a_terminal_is_told_before_the_work_starts(one_db: tuple[Config, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one line goes to a terminal only (not with --json or into a pipe), and only for a database split up."""
    from pgidgen.cli.ddl import say_sizing

    config, _ = one_db
    init(config, SHARDS)
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    seen: list[object] = []
    apply_ddl(config, read_file(ddl), on_plan=seen.append)
    (plan,) = seen
    say_sizing(plan, False)
    assert capsys.readouterr().err == ""
    say_sizing(plan, True)
    assert capsys.readouterr().err == plan.sizing["a"].describe("a") + "\n"  # type: ignore[attr-defined]
