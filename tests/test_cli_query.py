"""`pgidgen query` (issue 34): Router.fan_out from the command line through the admin connections; its output
(psql's aligned table, JSON lines, the SQL with --sql) and its errors, exact."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from test_routing import SHARDS
from test_routing_outage import db2_server  # noqa: F401 (a fixture)

from pgidgen import sandbox
from pgidgen.cli import main
from pgidgen.config import Config, describe_dsn
from pgidgen.init import init

#: shard -> rows (v, name): db1 holds 0-3, db2 4-7
ROWS: dict[int, list[tuple[int, str | None]]] = {1: [(10, "a")], 2: [(20, "b"), (21, None)], 5: [(50, "e")]}


@pytest.fixture
def filled(config: Config) -> Config:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    for name in ("db1", "db2"):
        with psycopg.connect(config.dsn(name), autocommit=True) as c:
            for s in range(4) if name == "db1" else range(4, 8):
                c.execute(f"CREATE TABLE shard_{s}.t (v int, name text)")
                for v, n in ROWS.get(s, []):
                    c.execute(f"INSERT INTO shard_{s}.t VALUES (%s, %s)", (v, n))
    return config


def run(config_file: Path, *args: Any) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), "query", *map(str, args)])


def test_query_prints_the_rows_merged(filled: Config, config_file: Path) -> None:
    r = run(config_file, "SELECT v, name FROM t", "--order-by", "-v", "--with-shard")
    assert (r.exit_code, r.output) == (0, " shard | v  | name\n"
                                          "-------+----+------\n"
                                          "     5 | 50 | e\n"
                                          "     2 | 21 |\n"
                                          "     2 | 20 | b\n"
                                          "     1 | 10 | a\n"
                                          "(4 rows)\n")
    r = run(config_file, "SELECT v, name FROM t WHERE v > %s".replace("%s", "15"), "--order-by", "name DESC", "--order-by", "v", "--limit", "2", "--json")
    assert (r.exit_code, r.output) == (0, '{"v": 21, "name": null}\n{"v": 50, "name": "e"}\n')
    r = run(config_file, "SELECT count(*), max(v) FROM t", "--combine", "sum,max")
    assert (r.exit_code, r.output) == (0, " count | max\n-------+-----\n     4 |  50\n(1 row)\n")
    r = run(config_file, "SELECT name IS NULL AS unnamed, count(*) AS n FROM t GROUP BY 1", "--combine", "group,sum", "--order-by", "unnamed")
    assert (r.exit_code, r.output) == (0, " unnamed | n\n---------+---\n f       | 3\n t       | 1\n(2 rows)\n")
    r = run(config_file, "SELECT count(*) AS rows FROM t", "--with-shard", "--shards", "1,2,5-6", "--order-by", "-rows, shard")
    assert (r.exit_code, r.output) == (0, " shard | rows\n-------+------\n     2 |    2\n     1 |    1\n     5 |    1\n     6 |    0\n(4 rows)\n")
    r = run(config_file, "SELECT v FROM t WHERE false")
    assert (r.exit_code, r.output) == (0, " v\n---\n(0 rows)\n")


def test_query_sql_prints_what_each_database_would_be_sent(filled: Config, config_file: Path) -> None:
    r = run(config_file, "SELECT v FROM t WHERE name = 'b'", "--shards", "1,2,5", "--order-by", "v", "--limit", "1", "--sql")
    claim = ("SELECT pg_catalog.set_config('search_path', '\"public\"', true), (SELECT pg_catalog.count(pgidgen.claim_shard(a.s, false))"
             " FROM pg_catalog.unnest('{%s}'::pg_catalog.int4[]) AS a(s) LEFT JOIN pgidgen.shards AS t ON t.shard OPERATOR(pg_catalog.=) a.s"
             " AND t.state OPERATOR(pg_catalog.=) ANY ('{active,moving}'::pg_catalog.text[]) WHERE false OR t.shard IS NULL);")
    assert (r.exit_code, r.output) == (0, "-- ===== database db1 =====\n"
                                          "BEGIN READ ONLY;\n"
                                          f"{claim % '1,2'}\n"
                                          "SELECT * FROM ((SELECT q.* FROM (SELECT v FROM \"shard_1\".t WHERE name = 'b') AS q ORDER BY \"v\" LIMIT 1)"
                                          " UNION ALL (SELECT q.* FROM (SELECT v FROM \"shard_2\".t WHERE name = 'b') AS q ORDER BY \"v\" LIMIT 1))"
                                          " AS u ORDER BY \"v\" LIMIT 1;\n"
                                          "COMMIT;\n"
                                          "-- ===== database db2 =====\n"
                                          "BEGIN READ ONLY;\n"
                                          f"{claim % '5'}\n"
                                          "(SELECT q.* FROM (SELECT v FROM \"shard_5\".t WHERE name = 'b') AS q ORDER BY \"v\" LIMIT 1);\n"
                                          "COMMIT;\n")


def test_query_errors(filled: Config, config_file: Path) -> None:
    where = describe_dsn(filled.dsn("db1"))
    cases = [
        (["SELECT nope FROM t"], f'Error: the fan-out failed on database db1, shards 0-3, at the statement: column "nope" does not exist'
                                 f" [SQLSTATE 42703] (db1, {where}): fix the statement\n"),
        (["SELECT v FROM t", "--shards", "0-8"], "Error: shard 8 does not exist: shards are numbered 0 to 7\n"),
        (["SELECT v FROM t", "--shards", "1,,2"], "Error: '1,,2' has an empty item between its commas: write shards like 0-99,120, a number or"
                                                  " range between each two commas\n"),
        (["SELECT 1; SELECT 2"], "Error: a fan-out runs one statement, not 2: run them one by one\n"),
        (["DROP TABLE t"], "Error: a fan-out runs a SELECT (or an INSERT, UPDATE, DELETE) on every shard, not DROP TABLE: DDL goes to every"
                           " shard by 'pgidgen apply-ddl'; anything else, by Router.run on each shard\n"),
        (["SELECT count(*) FROM t", "--combine", "avg"], "Error: combine 'avg' is not one of sum, min, max: counts add up with sum; for an"
                                                         " average, return a sum and a count, and divide\n"),
        (["SELECT v, name FROM t", "--combine", "sum"], "Error: combine 'sum' cannot add up name: its values are not numbers (text)"
                                                        ": combine numbers, and group by the others (group)\n"),
        (["SELECT count(*), 1 FROM t", "--combine", "sum,sum,sum"], "Error: combine names 3 operations for 2 columns (count, ?column?): give one"
                                                                    " for each column: sum, min, max, or None (on the command line: group) for a column to group by\n"),
        (["SELECT v FROM t", "--order-by", "-v desc"], "Error: order_by '-v desc' is not a column name with an optional direction: write it like"
                                                        " id, -id or 'id DESC' (an output column of the statement), several separated by commas\n"),
        (["SELECT v FROM t", "--limit", "-1"], "Error: Invalid value for '--limit': -1 is not in the range x>=0. (main query): see"
                                               " 'main query --help'\n"),  # (the program is "main" under CliRunner)
        (["UPDATE t SET v = 1"], "Error: the statement is an UPDATE, and the fan-out is read-only: Router.fan_out(..., read_only=False)"
                                 " writes to every shard (pgidgen query only reads)\n"),
    ]
    for args, text in cases:
        r = run(config_file, *args)
        assert (r.exit_code, r.output) == (1, text), args


def test_query_partial_prints_what_answered_and_names_the_rest(filled: Config, config_file: Path, db2_server: sandbox.Server) -> None:  # noqa: F811
    sandbox.stop(db2_server)
    r = run(config_file, "SELECT v FROM t", "--order-by", "v")
    assert r.exit_code == 1 and r.output.startswith(f"Error: database db2 ({describe_dsn(filled.dsn('db2'))}) is unreachable: ")
    assert "; its shards 4-7 were not read: check that its server is running" in r.output
    r = run(config_file, "SELECT v FROM t", "--order-by", "v", "--partial")
    assert r.exit_code == 1
    assert r.stdout == " v\n----\n 10\n 20\n 21\n(3 rows)\n"
    assert r.stderr.startswith("Error: not every shard was read: database db2 (") and "its shards 4-7 were not read" in r.stderr

