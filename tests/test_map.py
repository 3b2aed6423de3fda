"""map/status: the map from every catalog, and each kind of inconsistency flagged."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
from click.testing import CliRunner

from pgidgen.cli import main
from pgidgen.config import Config, describe_dsn
from pgidgen.init import init
from pgidgen.shardmap import read_map


def run_map(config_file: Path, *args: str):
    return CliRunner().invoke(main, ["--config", str(config_file), "map", *args])


def test_map_collapses_ranges(config: Config, config_file: Path) -> None:
    init(config, 30, ["db1", "db2"])
    r = run_map(config_file)
    assert r.exit_code == 0, r.output
    assert r.stdout == (
        "shard count: 30\n"
        "db1: 15 shards 0-14, 0 bytes\n"
        "db2: 15 shards 15-29, 0 bytes\n"
        "db3: 0 shards -\n"
        "ok: every shard is in exactly one database\n"
    )
    data = json.loads(run_map(config_file, "--json").stdout)
    assert data["databases"]["db2"] == {"shards": "15-29", "count": 15, "bytes": 0}
    assert data["ok"] is True


def test_map_flags_inconsistencies(config: Config, config_file: Path) -> None:
    init(config, 10, ["db1", "db2"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("DROP FUNCTION shard_3.next_id")
        conn.execute("DROP SCHEMA shard_4 CASCADE")
        conn.execute("CREATE SCHEMA shard_99")
        conn.execute("ALTER SEQUENCE shard_1.pgidgen_counter CACHE 20")
    with psycopg.connect(config.dsn("db2"), autocommit=True) as conn:
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = 9")
        conn.execute("DROP SCHEMA shard_9 CASCADE")
    # shard 2 also registered on db2: in two databases
    with psycopg.connect(config.dsn("db2"), autocommit=True) as conn:
        conn.execute("INSERT INTO pgidgen.shards (shard, schema_name) VALUES (2, 'shard_2')")
    m = read_map(config)
    assert not m.ok
    assert m.problems == [
        "db1: a generator sequence of shard_1 has CACHE > 1, so next_id() could repeat IDs: "
        "ALTER SEQUENCE shard_1.pgidgen_counter CACHE 1 (and pgidgen_offset)",
        "db1: schema shard_3 is missing its next_id() function or a generator sequence",
        "db1: shard 4 is in the catalog but schema shard_4 is missing",
        "db1: schemas named like shards but not in pgidgen's catalog: shard_99",
        "db2: shard 2 is in the catalog but schema shard_2 is missing",
        "shard 2 is active in more than one database: db1, db2",
        "shards in no database: 9",
        # with a shard in no database, the database without a catalog may be where it was (its connection string
        # naming another database than init used): named, with the database it reached
        f"no pgidgen catalog in db3 ({describe_dsn(config.dsn('db3'))}): check that db3's connection string names the database"
        " init used; if db3 is new, run 'pgidgen init --shards 10'",
    ]
    r = run_map(config_file)
    assert r.exit_code == 1
    assert "PROBLEM: shards in no database: 9\n" in r.stdout


def test_map_reports_unreachable(tmp_path: Path, fresh_dsns: dict[str, str]) -> None:
    path = tmp_path / "pgidgen.toml"
    path.write_text(f'[databases]\ndb1 = "{fresh_dsns["db1"]}"\ngone = "postgresql://x@127.0.0.1:1/x"\n')
    r = CliRunner().invoke(main, ["--config", str(path), "map"])
    assert r.exit_code == 1
    assert "gone: UNREACHABLE: cannot connect to database gone (127.0.0.1:1/x)" in r.stdout


def test_map_flags_a_config_layout_other_than_the_installed_one(config: Config, tmp_path: Path) -> None:
    """decode and locate use the config's layout: one that is not the installed one reads every ID wrongly, and
    map said ok (found by a review)."""
    from dataclasses import replace

    from pgidgen.config import write_config

    init(config, 4, ["db1"])
    other = tmp_path / "other.toml"
    write_config(other, replace(config.layout, epoch_ms=config.layout.epoch_ms - 365 * 86_400_000), config.databases)
    r = CliRunner().invoke(main, ["--config", str(other), "map"])
    assert r.exit_code == 1
    assert "PROBLEM: the config's layout (epoch " in r.output and "is not the one installed" in r.output, r.output


def test_map_flags_active_shards_beyond_the_shard_count(config: Config, config_file: Path) -> None:
    """An active row for a shard at or above the layout's shard count (added by hand, or left by a catalog whose
    count was lowered) was listed as served and map said ok, though no key or ID routes to it (found by a review)."""
    init(config, 12, ["db1", "db2"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("INSERT INTO pgidgen.shards (shard, schema_name) VALUES (40, 'shard_40')")
        conn.execute("CREATE SCHEMA shard_40")
    for name in ("db1", "db2"):
        with psycopg.connect(config.dsn(name), autocommit=True) as conn:
            conn.execute("UPDATE pgidgen.layout SET shard_count = 10")
    m = read_map(config)
    assert m.problems == [
        "db1: schema shard_40 is missing its next_id() function or a generator sequence",
        "db1: shard 40 is active in the catalog but the shard count is 10 (shards 0-9), so nothing routes to it:"
        " delete its row from pgidgen.shards (and the schema, once any data is saved)",
        "db2: shards 10-11 are active in the catalog but the shard count is 10 (shards 0-9), so nothing routes to them:"
        " delete their rows from pgidgen.shards (and the schemas, once any data is saved)",
    ]
    r = run_map(config_file)
    assert r.exit_code == 1 and "PROBLEM: db2: shards 10-11 are active in the catalog but the shard count is 10" in r.stdout, r.stdout
