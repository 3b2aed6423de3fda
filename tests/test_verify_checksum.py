"""The move's table checksum (count and sum of row hashes) on a real server: equal for the same rows in any
physical order, different for every kind of difference a broken copy could make, NULLs included."""
from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgidgen.move.verify import checksums, column_hashes

Row = tuple[Any, ...]
COLUMNS = "a bigint, b bigint, c text, d int"

#: (id, left rows, right rows, equal?)
CASES: list[tuple[str, list[Row], list[Row], bool]] = [
    ("same rows, other order", [(1, 2, "x", 3), (4, 5, "y", None)], [(4, 5, "y", None), (1, 2, "x", 3)], True),
    ("same rows with NULLs", [(1, None, None, None), (None, None, None, None)], [(None, None, None, None), (1, None, None, None)], True),
    ("two columns swapped in a row", [(1, 2, "x", 3)], [(2, 1, "x", 3)], False),
    ("a value and a NULL swapped", [(7, None, "x", 3)], [(None, 7, "x", 3)], False),
    ("a changed value in a row with a NULL", [(1, None, "x", 3)], [(1, None, "y", 3)], False),
    ("a NULL that became a value", [(1, 2, None, 3)], [(1, 2, "", 3)], False),
    ("values swapped between rows", [(1, 2, "x", 3), (4, 5, "y", 6)], [(1, 2, "y", 3), (4, 5, "x", 6)], False),
    ("a row twice instead of two rows", [(1, 2, "x", 3), (1, 2, "x", 3)], [(1, 2, "x", 3), (1, 2, "x", 4)], False),
    ("a row lost", [(1, 2, "x", 3), (4, 5, "y", 6)], [(1, 2, "x", 3)], False),
]


@pytest.fixture(scope="module")
def conn(pg_servers: Any) -> Any:
    with psycopg.connect(pg_servers[0].dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS checksum_cases CASCADE")
        c.execute("CREATE SCHEMA checksum_cases")
        yield c
        c.execute("DROP SCHEMA checksum_cases CASCADE")


@pytest.mark.parametrize("left, right, equal", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_checksum_tells_tables_apart(conn: Any, left: list[Row], right: list[Row], equal: bool) -> None:
    for name, rows in (("l", left), ("r", right)):
        conn.execute(f"DROP TABLE IF EXISTS checksum_cases.{name}")
        conn.execute(f"CREATE TABLE checksum_cases.{name} ({COLUMNS})")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO checksum_cases.{name} VALUES (%s, %s, %s, %s)", rows)
    columns = column_hashes(conn, "checksum_cases")
    assert [c.name for c in columns["l"]] == ["a", "b", "c", "d"] and all(c.function for c in columns["l"])
    sums = checksums(conn, "checksum_cases", ["l", "r"], {"r": columns["l"], "l": columns["l"]})
    assert sums["l"][0] == len(left) and sums["r"][0] == len(right)
    assert (sums["l"] == sums["r"]) is equal
