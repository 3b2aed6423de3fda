"""Comparing the two copies of a shard, table by table: row count and a checksum of every row.

The checksum is the sum of 64-bit hashes of each row (each column hashed by its type's hash function,
combined per row; see sqltext.checksum_sql), so it needs no sort: one
sequential scan per table on each server, both servers at once. A 1M-row table takes about as long as
`SELECT count(*)` plus hashing; an ORDER BY over the primary key would add a sort or an index scan for nothing,
because the sum does not depend on order.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Collection, Sequence

import psycopg

from .sqltext import COLUMN_HASHES_SQL, VERIFY_SETTINGS, ColumnHash, checksum_sql


@dataclass
class TableCheck:
    table: str
    source_rows: int
    target_rows: int
    source_sum: str
    target_sum: str

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "ok": self.ok, "source_rows": self.source_rows, "target_rows": self.target_rows,
                "source_checksum": self.source_sum, "target_checksum": self.target_sum}

    def describe(self) -> str:
        if self.ok:
            return f"{self.table}: {self.source_rows} rows, checksums match"
        return f"{self.table}: source {self.source_rows} rows (checksum {self.source_sum}), target {self.target_rows} rows (checksum {self.target_sum})"


@dataclass
class Verification:
    tables: list[TableCheck] = field(default_factory=list)
    when: str = "at the cutover point"

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables)

    @property
    def rows(self) -> int:
        return sum(t.source_rows for t in self.tables)

    def mismatches(self) -> list[TableCheck]:
        return [t for t in self.tables if not t.ok]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "when": self.when, "rows": self.rows, "tables": [t.as_dict() for t in self.tables]}


def column_hashes(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[ColumnHash]]:
    """Read on one side (the source) so both sides run the very same statements."""
    out: dict[str, list[ColumnHash]] = {}
    for table, column, fn_schema, fn_name, as_text in conn.execute(COLUMN_HASHES_SQL, (schema,)):
        out.setdefault(table, []).append(ColumnHash(column, (fn_schema, fn_name) if fn_name else None, bool(as_text)))
    return out


def checksums(
    conn: psycopg.Connection[Any],
    schema: str,
    tables: Sequence[str],
    columns: dict[str, list[ColumnHash]] | None = None,
    *,
    as_text: Collection[str] = (),
) -> tuple[dict[str, tuple[int, str]], set[str]]:
    """Runs in whatever transaction conn is in (the caller's snapshot is what gets compared). Tables in as_text,
    and those whose columns this side cannot hash as the source's (a column type with no such hash function, a
    column missing), are checksummed over their rows' text; returns the checksums and those tables."""
    conn.execute(VERIFY_SETTINGS.replace("SET ", "SET LOCAL ") if not conn.autocommit else VERIFY_SETTINGS)
    out: dict[str, tuple[int, str]] = {}
    texts = set(as_text)
    for t in tables:
        row = None
        if t not in texts:
            try:
                with conn.transaction():  # a savepoint inside the caller's snapshot
                    row = conn.execute(checksum_sql(schema, t, None if columns is None else columns.get(t, []))).fetchone()
            except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedColumn):
                texts.add(t)
        if row is None:
            row = conn.execute(checksum_sql(schema, t, as_text=True)).fetchone()
        assert row is not None
        out[t] = (int(row[0]), str(row[1]))
    return out, texts


def compare(
    source: psycopg.Connection[Any],
    source_schema: str,
    target: psycopg.Connection[Any],
    target_schema: str,
    tables: Sequence[str],
    *,
    when: str = "at the cutover point",
) -> Verification:
    """Both sides at once, each in its own thread (the two connections are independent). A table one side had
    to checksum as text is checksummed as text on the other side too, so the two forms are never compared."""
    columns = column_hashes(source, source_schema)
    with ThreadPoolExecutor(max_workers=2) as pool:
        fs = pool.submit(checksums, source, source_schema, tables, columns)
        ft = pool.submit(checksums, target, target_schema, tables, columns)
        (s, s_text), (t, t_text) = fs.result(), ft.result()
    if s_text - t_text:
        t.update(checksums(target, target_schema, sorted(s_text - t_text), as_text=s_text)[0])
    if t_text - s_text:
        s.update(checksums(source, source_schema, sorted(t_text - s_text), as_text=t_text)[0])
    return Verification([TableCheck(name, s[name][0], t[name][0], s[name][1], t[name][1]) for name in tables], when=when)
