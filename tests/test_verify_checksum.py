"""The move's table checksum (count and sum of row hashes) on a real server: equal for the same rows in any
physical order, different for every kind of difference a broken copy could make, NULLs and the values some
hash functions treat specially (0.0, empty arrays and objects, equal-but-not-identical values) included."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from pgidgen.move.verify import checksums, column_hashes, compare

ROW4 = "a bigint, b bigint, c text, d int"
#: (id, columns, left rows, right rows, equal?): rows as SQL literals
CASES: list[tuple[str, str, list[str], list[str], bool]] = [
    ("same rows, other order", ROW4, ["(1, 2, 'x', 3)", "(4, 5, 'y', NULL)"], ["(4, 5, 'y', NULL)", "(1, 2, 'x', 3)"], True),
    ("same rows with NULLs", ROW4, ["(1, NULL, NULL, NULL)", "(NULL, NULL, NULL, NULL)"], ["(NULL, NULL, NULL, NULL)", "(1, NULL, NULL, NULL)"], True),
    ("two columns swapped in a row", ROW4, ["(1, 2, 'x', 3)"], ["(2, 1, 'x', 3)"], False),
    ("a value and a NULL swapped", ROW4, ["(7, NULL, 'x', 3)"], ["(NULL, 7, 'x', 3)"], False),
    ("a changed value in a row with a NULL", ROW4, ["(1, NULL, 'x', 3)"], ["(1, NULL, 'y', 3)"], False),
    ("a NULL that became a value", ROW4, ["(1, 2, NULL, 3)"], ["(1, 2, '', 3)"], False),
    ("values swapped between rows", ROW4, ["(1, 2, 'x', 3)", "(4, 5, 'y', 6)"], ["(1, 2, 'y', 3)", "(4, 5, 'x', 6)"], False),
    ("a row twice instead of two rows", ROW4, ["(1, 2, 'x', 3)", "(1, 2, 'x', 3)"], ["(1, 2, 'x', 3)", "(1, 2, 'x', 4)"], False),
    ("a row lost", ROW4, ["(1, 2, 'x', 3)", "(4, 5, 'y', 6)"], ["(1, 2, 'x', 3)"], False),
    ("keys swapped beside a NULL varchar", "a bigint, v varchar, d int", ["(1, NULL, 5)", "(2, NULL, 6)"], ["(2, NULL, 5)", "(1, NULL, 6)"], False),
    ("a key changed beside an empty array", "a bigint, arr int[], d int", ["(1, '{}', 5)"], ["(7, '{}', 5)"], False),
    ("text changed beside an array of NULLs", "s text, arr int[], d int", ["('a', '{NULL}', 5)"], ["('zzz', '{NULL}', 5)"], False),
    ("a float 0 swapped with another column", "x float8, y float8", ["(0, 3.5)"], ["(3.5, 0)"], False),
    ("a NULL that became 0.0", "x float8, y float8", ["(NULL, 0.0)"], ["(NULL, NULL)"], False),
    ("-0 and 0", "x float8", ["('-0')"], ["(0)"], False),
    ("numeric 1.50 and 1.5", "n numeric", ["(1.50)"], ["(1.5)"], False),
    ("interval 1 day and 24 hours", "i interval", ["('1 day')"], ["('24 hours')"], False),
    ("jsonb {} and []", "a int, j jsonb", ["(1, '{}')"], ["(1, '[]')"], False),
    ("numeric arrays {1.50} and {1.5}", "n numeric[]", ["('{1.50}')"], ["('{1.5}')"], False),
    ("case under a case-insensitive collation", "t text COLLATE checksum_cases.ci", ["('Bob')"], ["('bob')"], False),
    # hashint8extended folds a bigint's two 32-bit halves into one before hashing: so do the types built on it
    ("bigint halves swapped", "a bigint, b int", ["(x'0000000100000002'::bigint, 1)"], ["(x'0000000200000001'::bigint, 1)"], False),
    ("bigint 1 and 2^32", "a bigint", ["(1)", "(5)"], ["(4294967296)", "(5)"], False),
    ("bigint arrays {1} and {2^32}", "a bigint[]", ["('{1}')"], ["('{4294967296}')"], False),
    ("int8 ranges", "r int8range", ["('[1,3)')"], ["('[4294967296,4294967298)')"], False),
    ("timestamptz 2^32 microseconds apart with the same fold", "t timestamptz",
     ["('2000-01-01 00:00:00.000001+00')"], ["('2000-01-01 00:00:00+00'::timestamptz + 4294967296 * interval '1 microsecond')"], False),
    ("timestamp 2^32 microseconds apart with the same fold", "t timestamp",
     ["('2000-01-01 00:00:00.000001')"], ["('2000-01-01 00:00:00'::timestamp + 4294967296 * interval '1 microsecond')"], False),
    ("time of day 2^32 microseconds apart with the same fold", "t time", ["('00:00:00.000001')"], ["('01:11:34.967296')"], False),
    ("pg_lsn halves swapped", "l pg_lsn", ["('1/2')"], ["('2/1')"], False),
]


@pytest.fixture(scope="module")
def conn(pg_servers: Any) -> Any:
    with psycopg.connect(pg_servers[0].dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS checksum_cases CASCADE")
        c.execute("CREATE SCHEMA checksum_cases")
        try:
            c.execute("CREATE COLLATION checksum_cases.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        except psycopg.Error:
            pass  # a server without ICU: the collation case skips
        yield c
        c.execute("DROP SCHEMA checksum_cases CASCADE")


@pytest.mark.parametrize("columns, left, right, equal", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_checksum_tells_tables_apart(conn: Any, columns: str, left: list[str], right: list[str], equal: bool) -> None:
    if "checksum_cases.ci" in columns and conn.execute("SELECT to_regcollation('checksum_cases.ci')").fetchone()[0] is None:
        pytest.skip("this server has no ICU collations")
    for name, rows in (("l", left), ("r", right)):
        conn.execute(f"DROP TABLE IF EXISTS checksum_cases.{name}")
        conn.execute(f"CREATE TABLE checksum_cases.{name} ({columns})")
        conn.execute(f"INSERT INTO checksum_cases.{name} VALUES {', '.join(rows)}")
    hashes = column_hashes(conn, "checksum_cases")
    assert hashes["l"] == hashes["r"]
    sums, forms = checksums(conn, "checksum_cases", ["l", "r"], {"l": hashes["l"], "r": hashes["l"]})
    assert forms == {"l": 0, "r": 0}
    assert sums["l"][0] == len(left) and sums["r"][0] == len(right)
    assert (sums["l"] == sums["r"]) is equal


@contextmanager
def two_tables(conn: Any, dsn: str, columns_a: str, columns_b: str, insert: str) -> Iterator[Callable[[], bool]]:
    """checksum_a.t and checksum_b.t with the given columns and the same rows; yields compare(a, b).ok."""
    for schema, cols in (("checksum_a", columns_a), ("checksum_b", columns_b)):
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.t ({cols})")
        conn.execute(f"INSERT INTO {schema}.t {insert}")
    try:
        with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
            yield lambda: compare(a, "checksum_a", b, "checksum_b", ["t"]).ok
    finally:
        conn.execute("DROP SCHEMA checksum_a CASCADE")
        conn.execute("DROP SCHEMA checksum_b CASCADE")


def test_a_table_one_side_must_checksum_as_text_is_text_on_both(conn: Any, pg_servers: Any) -> None:
    """`--verify` after DDL changed a column's type on one side: the source's hash function does not take the
    other type, so that side hashes rows as text, and so must the other side, or equal data would differ."""
    with two_tables(conn, pg_servers[0].dsn, "id int PRIMARY KEY, note text", "id bigint PRIMARY KEY, note text",
                    "VALUES (1, 'x'), (2, NULL)") as same:
        assert same()
        conn.execute("UPDATE checksum_b.t SET note = 'y' WHERE id = 1")
        assert not same()


def test_columns_without_a_hash_are_compared_by_name(conn: Any, pg_servers: Any) -> None:
    """A json column has no hash function: the table is checksummed over each column's text, by name, so the
    same rows in tables whose columns stand in another order (a child table recreated by pg_dump) match."""
    with two_tables(conn, pg_servers[0].dsn, "id int, a text, x int, j json, b text", "id int, a text, b text, x int, j json",
                    "(id, a, b, x, j) VALUES (1, 'p', 'q', 7, '{\"k\": 1}'), (2, NULL, 'r', NULL, NULL)") as same:
        assert same()
        conn.execute("UPDATE checksum_b.t SET j = '{\"k\": 2}' WHERE id = 1")
        assert not same()
