"""What apply-ddl --dry-run says a file will lock (issue 32, item 3): per statement the lock mode on which table,
whether it rewrites the table, and a warning with the online alternative for the known dangerous forms."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.ddl import parse_file
from pgidgen.ddl.lockplan import plan_file, plan_source
from pgidgen.init import init

AE, SUE, SRE, SHARE = "ACCESS EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE ROW EXCLUSIVE", "SHARE"

# statement, {table: mode}, rewrites, a warning's words (None: no warning)
CASES = [
    ("ALTER TABLE t ADD COLUMN note text", {"t": AE}, False, None),
    ("ALTER TABLE t ADD COLUMN n int NOT NULL DEFAULT 0", {"t": AE}, False, None),
    ("ALTER TABLE t ADD COLUMN at timestamptz DEFAULT now()", {"t": AE}, False, None),
    ("ALTER TABLE t ADD COLUMN r float8 DEFAULT random()", {"t": AE}, True, "backfill it in batches"),
    ("ALTER TABLE t ADD COLUMN at timestamptz DEFAULT clock_timestamp()", {"t": AE}, True, "clock_timestamp()"),
    ("ALTER TABLE t ADD COLUMN i bigint DEFAULT next_id()", {"t": AE}, True, "next_id()"),
    ("ALTER TABLE t ADD COLUMN s bigserial", {"t": AE}, True, "sequence"),
    ("ALTER TABLE t ADD COLUMN x int DEFAULT my_func()", {"t": AE}, None, "may rewrite"),
    ("ALTER TABLE t ADD COLUMN g int GENERATED ALWAYS AS (v * 2) STORED", {"t": AE}, True, "STORED"),
    ("ALTER TABLE t ALTER COLUMN v TYPE bigint", {"t": AE}, True, "new column, backfill"),
    ("ALTER TABLE t ALTER COLUMN name TYPE text", {"t": AE}, None, "binary-coercible"),
    ("ALTER TABLE t ALTER COLUMN v SET STATISTICS 500", {"t": SUE}, False, None),
    ("ALTER TABLE t ALTER COLUMN v SET (n_distinct = 100)", {"t": SUE}, False, None),
    ("ALTER TABLE t SET (fillfactor = 70, autovacuum_enabled = off)", {"t": SUE}, False, None),
    ("ALTER TABLE t SET (user_catalog_table = true)", {"t": AE}, False, None),
    ("ALTER TABLE t SET UNLOGGED", {"t": AE}, True, "rewrites t"),
    ("ALTER TABLE t ALTER COLUMN v SET DEFAULT 1", {"t": AE}, False, None),
    ("ALTER TABLE t DROP COLUMN v", {"t": AE}, False, None),
    ("ALTER TABLE t ALTER COLUMN v SET NOT NULL", {"t": AE}, False, "IS NOT NULL) proves it"),
    ("ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (u) REFERENCES users (id)", {"t": SRE, "users": SRE}, False, "NOT VALID, then VALIDATE"),
    ("ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (u) REFERENCES users (id) NOT VALID", {"t": SRE, "users": SRE}, False, None),
    ("ALTER TABLE t ADD CONSTRAINT ck CHECK (v > 0)", {"t": AE}, False, "NOT VALID, then VALIDATE"),
    ("ALTER TABLE t ADD CONSTRAINT ck CHECK (v > 0) NOT VALID", {"t": AE}, False, None),
    ("ALTER TABLE t VALIDATE CONSTRAINT ck", {"t": SUE}, False, None),
    ("ALTER TABLE t ADD PRIMARY KEY (id)", {"t": AE}, False, "USING INDEX"),
    ("ALTER TABLE t ADD CONSTRAINT u UNIQUE USING INDEX t_v", {"t": AE}, False, None),
    ("ALTER TABLE t DISABLE TRIGGER tg", {"t": SRE}, False, None),
    ("ALTER TABLE t RENAME TO t2", {"t": AE}, False, None),
    ("ALTER INDEX t_v RENAME TO t_v2", {"t_v": SUE}, False, None),
    ("CREATE INDEX ON t (v)", {"t": SHARE}, False, "CREATE INDEX CONCURRENTLY"),
    ("CREATE INDEX CONCURRENTLY ON t (v)", {"t": SUE}, False, None),
    ("DROP INDEX CONCURRENTLY t_v", {"t_v": SUE}, False, None),
    ("CREATE TRIGGER tg BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION f()", {"t": SRE}, False, None),
    ("DROP TRIGGER tg ON t", {"t": AE}, False, None),
    ("DROP TABLE t, u", {"t": AE, "u": AE}, False, None),
    ("TRUNCATE t", {"t": AE}, False, None),
    ("CREATE TABLE n (id bigint PRIMARY KEY, u bigint REFERENCES users (id))", {"users": SRE}, False, None),
    ("CREATE VIEW w AS SELECT * FROM t", {}, False, None),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'", {}, False, None),
    ("LOCK TABLE t IN SHARE ROW EXCLUSIVE MODE", {"t": SRE}, False, None),
]


@pytest.mark.parametrize(("sql", "locks", "rewrites", "warning"), CASES, ids=[c[0][:60] for c in CASES])
def test_statement_locks(sql: str, locks: dict[str, str], rewrites: bool | None, warning: str | None) -> None:
    [s] = plan_source(sql + ";")
    assert {lk.table: lk.mode for lk in s.locks} == locks
    assert s.rewrites is rewrites
    if warning is None:
        assert s.warnings == []
    else:
        assert len(s.warnings) == 1 and warning in s.warnings[0]


def test_a_table_the_file_creates_gets_no_warning_and_the_shard_names_are_bare() -> None:
    text = "CREATE TABLE n (id bigint PRIMARY KEY, v int);\nCREATE INDEX ON n (v);\nALTER TABLE n ADD CONSTRAINT ck CHECK (v > 0);\nCREATE INDEX ON t (v);\n"
    plan = plan_file(parse_file(text, "f.sql"))
    assert [(s.line, [lk.table for lk in s.locks], len(s.warnings), s.harmless) for s in plan] == [
        (1, [], 0, True), (2, ["n"], 0, True), (3, ["n"], 0, True), (4, ["t"], 1, False)]
    small = plan_file(parse_file(text, "f.sql"), sizes={"t": 8192})
    assert small[3].warnings == []  # known to be small: no warning


@pytest.mark.parametrize(("before", "change", "rewrites"), [
    ("character varying(20)", "varchar(40)", False), ("character varying(20)", "text", False), ("text", "varchar", False),
    ("character varying(20)", "varchar(10)", True), ("integer", "text", True), ("numeric(10,2)", "numeric(12,2)", False),
    ("numeric(10,2)", "numeric(12,3)", True), ("numeric(10,2)", "numeric", False),
])
def test_a_type_change_rewrites_unless_binary_coercible_from_the_type_before(before: str, change: str, rewrites: bool) -> None:
    [s] = plan_file(parse_file(f"ALTER TABLE t ALTER COLUMN c TYPE {change};", "f.sql"), columns={("t", "c"): before})
    assert s.rewrites is rewrites and s.retyped == ["t.c"]
    assert bool(s.warnings) is rewrites and all(f"(from {before})" in w for w in s.warnings)


def test_several_subcommands_take_the_strongest_lock() -> None:
    [s] = plan_source("ALTER TABLE t ALTER COLUMN v SET STATISTICS 100, ADD COLUMN w int;")
    assert [(lk.table, lk.mode) for lk in s.locks] == [("t", AE)]
    assert s.what == "ALTER TABLE t ALTER COLUMN v SET STATISTICS, ADD COLUMN w"


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def test_dry_run_reads_table_sizes_from_the_first_shard(config: Config, config_file: Path, tmp_path: Path) -> None:
    init(config, 4, ["db1", "db2"])
    (tmp_path / "t.sql").write_text("CREATE TABLE big (id bigint PRIMARY KEY DEFAULT next_id(), v int, pad text);\n"
                                    "CREATE TABLE small (id bigint PRIMARY KEY DEFAULT next_id(), v int, name varchar(20));\n")
    assert cli(config_file, "apply-ddl", str(tmp_path / "t.sql")).exit_code == 0
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:  # 12000 rows of 1 kB: over the 10 MB line
        conn.execute("INSERT INTO shard_0.big (v, pad) SELECT g, repeat('x', 1000) FROM generate_series(1, 12000) g")
    (tmp_path / "idx.sql").write_text("CREATE INDEX ON big (v);\nCREATE INDEX ON small (v);\nALTER TABLE small ADD COLUMN r float8 DEFAULT random();\n"
                                      "ALTER TABLE small ALTER COLUMN name TYPE varchar(40);\n")
    res = cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"), "--dry-run")
    assert res.exit_code == 0, res.output + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "statement 1 (line 1) CREATE INDEX on big: SHARE on big (writes wait); no rewrite, reads every row"
    assert lines[1].startswith("  warning: big holds 1") and lines[1].endswith("MB on the first shard: writes wait while the index builds; use CREATE INDEX CONCURRENTLY")
    assert lines[2] == "statement 2 (line 2) CREATE INDEX on small: SHARE on small (writes wait); no rewrite, reads every row"
    assert lines[3] == "statement 3 (line 3) ALTER TABLE small ADD COLUMN r: ACCESS EXCLUSIVE on small (reads and writes wait); rewrites the table"
    assert lines[4].startswith("  warning: ADD COLUMN r rewrites small under ACCESS EXCLUSIVE: its DEFAULT calls random()")
    assert lines[5] == "statement 4 (line 4) ALTER TABLE small ALTER COLUMN name TYPE: ACCESS EXCLUSIVE on small (reads and writes wait); no rewrite"
    assert lines[6] == "dry run of idx.sql: 4 statements, 2 with warnings (table sizes from db1 shard_0); nothing applied"
    data = json.loads(cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"), "--dry-run", "--json").stdout)
    assert data["sizes_from"] == "db1 shard_0" and [s["locks"][0]["mode"] for s in data["statements"]] == [SHARE, SHARE, AE, AE]
    with psycopg.connect(config.dsn("db1")) as conn:  # nothing applied
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = 'shard_0'").fetchone() == (2,)
    sql = cli(config_file, "apply-ddl", str(tmp_path / "idx.sql"), "--sql", "--shards", "4").stdout
    assert "-- statement 1 (line 1) CREATE INDEX on big: SHARE on big (writes wait); no rewrite, reads every row\n" in sql
    assert "--   warning: writes to big wait while the index builds: on a table over 10 MB use CREATE INDEX CONCURRENTLY\n" in sql
