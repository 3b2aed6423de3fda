"""Data-driven sharded-DDL cases from tests/ddl_cases/*.sql: one case per blank-line-separated block.

A block is SQL plus directives in comments:
- `-- setup: SQL` runs on every database before the case (objects outside the shards, e.g. public tables);
- `-- check: QUERY => EXPECTED` runs in several shards over several databases, `{shard}` standing for the
  shard's schema and `{n}` for its number; rows are joined with ", " and columns with "|";
- `-- error: TEXT` the exact error line the CLI prints (after "Error: "), `{file}` standing for the case's file;
- `-- output: TEXT` a line the CLI prints besides.
Test ids are `file:line`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.ddl.drift import read_drift
from pgidgen.init import init

pytestmark = pytest.mark.sensitive  # behaviour can differ between majors: runs on every one

CASES = Path(__file__).parent / "ddl_cases"
SHARDS = 6
CHECKED = (0, 3, 5)  # in db1, db2, db3


@dataclass
class Case:
    file: str
    line: int
    sql: str
    setup: list[str] = field(default_factory=list)
    checks: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    output: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(CASES.glob("*.sql")):
        lines = path.read_text(encoding="utf-8").split("\n")
        block: list[tuple[int, str]] = []
        for number, text in enumerate(lines + [""], 1):
            if text.strip():
                block.append((number, text))
                continue
            if block:
                cases.append(parse_case(path.name, block))
                block = []
    return cases


def parse_case(name: str, block: list[tuple[int, str]]) -> Case:
    case = Case(file=name, line=block[0][0], sql="")
    for _, text in block:
        for key in ("setup", "check", "error", "output"):
            prefix = f"-- {key}: "
            if text.startswith(prefix):
                value = text[len(prefix):]
                if key == "setup":
                    case.setup.append(value)
                elif key == "check":
                    query, _, expected = value.partition(" => ")
                    case.checks.append((query, expected))
                elif key == "error":
                    case.error = value
                else:
                    case.output.append(value)
                break
    # the file the CLI sees keeps the block's line numbers, so positions in errors are the fixture's
    case.sql = "\n" * (block[0][0] - 1) + "\n".join(t for _, t in block) + "\n"
    return case


def rows_text(rows: list[tuple[object, ...]]) -> str:
    return ", ".join("|".join("" if v is None else str(v) for v in r) for r in rows)


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c.id)
def test_case(case: Case, config: Config, config_file: Path, tmp_path: Path) -> None:
    init(config, SHARDS)
    for statement in case.setup:
        for dsn in config.databases.values():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(statement.encode())
    path = tmp_path / case.file
    path.write_text(case.sql, encoding="utf-8")
    result = CliRunner().invoke(main, ["--config", str(config_file), "apply-ddl", str(path)])
    if case.error is not None:
        assert result.exit_code == 1, result.output
        assert result.output.splitlines()[-1] == "Error: " + case.error.format(file=case.file)
        out_lines = result.output.splitlines()
        for expected in case.output:
            assert expected.format(file=case.file) in "\n".join(out_lines)
        assert_nothing_applied(config)
        return
    assert result.exit_code == 0, result.output
    owner = {s: f"db{1 + s * 3 // SHARDS}" for s in range(SHARDS)}
    for shard in CHECKED:
        with psycopg.connect(config.databases[owner[shard]], autocommit=True) as conn:
            for query, expected in case.checks:
                rows = conn.execute(query.format(shard=f"shard_{shard}", n=shard).encode()).fetchall()
                assert rows_text(rows) == expected.format(shard=f"shard_{shard}", n=shard), f"{query} in shard_{shard}"
            count = conn.execute("SELECT count(*) FROM pgidgen.ddl_ledger WHERE shard = %s", (shard,)).fetchone()
            assert count == (1,)
    drift = read_drift(config)  # every shard in every database looks the same, whatever the case created
    assert (drift.problems, drift.fingerprints, drift.shards) == ([], 1, SHARDS)


def assert_nothing_applied(config: Config) -> None:
    for dsn in config.databases.values():
        with psycopg.connect(dsn, autocommit=True) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname LIKE 'shard\\_%' AND c.relkind IN ('r', 'p', 'v')").fetchone()
            assert tables == (0,)
            ledger = conn.execute("SELECT to_regclass('pgidgen.ddl_ledger') IS NULL OR NOT EXISTS (SELECT 1 FROM pgidgen.ddl_ledger)").fetchone()
            assert ledger == (True,)
