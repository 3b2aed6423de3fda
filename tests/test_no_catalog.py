"""A database without a pgidgen catalog is named where it matters: its shards are in no database because its
connection string reaches another database than init used (a database name left out connects to the user's), or
because it was never initialised. A new database that every shard's absence does not point at is no problem."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

from pgidgen.cli import main
from pgidgen.config import Config, describe_dsn, write_config
from pgidgen.errors import ShardUnavailableError
from pgidgen.init import init
from pgidgen.routing import Router

HINT = "check that db2's connection string names the database init used; if db2 is new, run 'pgidgen init --shards 4'"


def test_the_database_without_a_catalog_is_named_by_map_and_the_router(config: Config, config_file: Path, tmp_path: Path) -> None:
    init(config, 4, ["db1", "db2"])
    wrong = make_conninfo(config.dsn("db2"), dbname="postgres")  # db2's server, another database
    path = tmp_path / "wrong.toml"
    write_config(path, config.layout, {"db1": config.dsn("db1"), "db2": wrong})
    r = CliRunner().invoke(main, ["--config", str(path), "map"])
    assert r.exit_code == 1
    assert [line for line in r.output.splitlines() if line.startswith("PROBLEM")] == [
        "PROBLEM: shards in no database: 2-3",
        f"PROBLEM: no pgidgen catalog in db2 ({describe_dsn(wrong)}): {HINT}",
    ], r.output
    with Router(Config(layout=config.layout, databases={"db1": config.dsn("db1"), "db2": wrong}), listen=False, retry_for=0) as router:
        assert router.database_for(1) == "db1"
        with pytest.raises(ShardUnavailableError) as e:
            router.database_for(3)
        assert str(e.value) == f"no database serves shard 3 right now; no pgidgen catalog in db2: a move may be switching it over (retry); if it lasts, {HINT}"
    r = CliRunner().invoke(main, ["--config", str(config_file), "map"])  # db3 has none either, and is only new
    assert r.exit_code == 0 and "PROBLEM" not in r.output, r.output


def test_apply_ddl_says_a_database_has_no_catalog(config: Config, config_file: Path, tmp_path: Path) -> None:
    init(config, 4, ["db1", "db2"])
    path = tmp_path / "t.sql"
    path.write_text("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id());\n")
    r = CliRunner().invoke(main, ["--config", str(config_file), "apply-ddl", str(path)])
    assert r.exit_code == 0, r.output
    assert "db3: holds no shards (no pgidgen catalog: init or a move installs one)" in r.output.splitlines(), r.output
