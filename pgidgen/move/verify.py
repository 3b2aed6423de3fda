"""Comparing the two copies of a shard, table by table: row count and a checksum of every row.

The checksum is the sum of 64-bit hashes of each row (each column hashed by its type's hash function,
combined per row; see sqltext.checksum_sql), so it needs no sort: one
sequential scan per table on each server, both servers at once. A 1M-row table takes about as long as
`SELECT count(*)` plus hashing; an ORDER BY over the primary key would add a sort or an index scan for nothing,
because the sum does not depend on order.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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

    def lines(self) -> list[str]:
        return [f"verified {self.when}: {len(self.tables)} tables", *(f"  {t.describe()}" for t in self.tables)]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "when": self.when, "rows": self.rows, "tables": [t.as_dict() for t in self.tables]}


def column_hashes(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[ColumnHash]]:
    """Read on one side (the source) so both sides run the very same statements."""
    out: dict[str, list[ColumnHash]] = {}
    for table, column, fn_schema, fn_name, as_text, halves in conn.execute(COLUMN_HASHES_SQL, (schema,)):
        out.setdefault(table, []).append(ColumnHash(column, (fn_schema, fn_name) if fn_name else None, bool(as_text), bool(halves)))
    return out


#: How a table was checksummed, from the per-column hash functions (0) to each column's text (1) and the whole
#: row's text (2, when this side lacks one of the source's columns): a table is compared in the same form on both.
NATIVE, COLUMN_TEXT, ROW_TEXT = 0, 1, 2


def checksums(
    conn: psycopg.Connection[Any],
    schema: str,
    tables: Sequence[str],
    columns: dict[str, list[ColumnHash]] | None = None,
    *,
    forms: dict[str, int] | None = None,
) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
    """Runs in whatever transaction conn is in (the caller's snapshot is what gets compared). Each table in the
    form asked for (forms), or the first form this side can compute: a column type without the source's hash
    function (json, or a type changed by DDL) takes column text, a column missing the row's text. Returns the
    checksums and the form each table took."""
    conn.execute(VERIFY_SETTINGS.replace("SET ", "SET LOCAL ") if not conn.autocommit else VERIFY_SETTINGS)
    out: dict[str, tuple[int, str]] = {}
    took: dict[str, int] = {}
    for t in tables:
        cols = None if columns is None else columns.get(t, [])
        form = (forms or {}).get(t, NATIVE)
        while form != ROW_TEXT:  # the row's text always computes; the other forms may not on this side
            try:
                with conn.transaction():  # a savepoint inside the caller's snapshot
                    row = conn.execute(checksum_sql(schema, t, cols, as_text=form == COLUMN_TEXT)).fetchone()
                break
            except psycopg.errors.UndefinedFunction:
                form += 1
            except psycopg.errors.UndefinedColumn:
                form = ROW_TEXT
        else:
            row = conn.execute(checksum_sql(schema, t, as_text=True)).fetchone()
        assert row is not None
        out[t], took[t] = (int(row[0]), str(row[1])), form
    return out, took


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
    to checksum in a text form is checksummed in that form on the other side too, so forms are never mixed."""
    columns = column_hashes(source, source_schema)
    with ThreadPoolExecutor(max_workers=2) as pool:
        fs = pool.submit(checksums, source, source_schema, tables, columns)
        ft = pool.submit(checksums, target, target_schema, tables, columns)
        (s, s_form), (t, t_form) = fs.result(), ft.result()
    for sums, schema, conn, mine, theirs in ((s, source_schema, source, s_form, t_form), (t, target_schema, target, t_form, s_form)):
        redo = {name: theirs[name] for name in tables if theirs[name] > mine[name]}
        if redo:
            sums.update(checksums(conn, schema, sorted(redo), columns, forms=redo)[0])
    return Verification([TableCheck(name, s[name][0], t[name][0], s[name][1], t[name][1]) for name in tables], when=when)


def column_hashes_of(conn: psycopg.Connection[Any], schemas: Sequence[str]) -> dict[str, dict[str, list[ColumnHash]]]:
    """column_hashes of several schemas in one query (it reads whole catalogs)."""
    out: dict[str, dict[str, list[ColumnHash]]] = {s: {} for s in schemas}
    sql = "SELECT n.nspname, " + COLUMN_HASHES_SQL.strip()[len("SELECT "):].replace("WHERE n.nspname = %s", "WHERE n.nspname = ANY(%s)")
    for schema, table, column, fn_schema, fn_name, as_text, halves in conn.execute(sql, (list(schemas),)):
        out[schema].setdefault(table, []).append(ColumnHash(column, (fn_schema, fn_name) if fn_name else None, bool(as_text), bool(halves)))
    return out


#: At most this many tables are checksummed in one statement (compare_many): a batch of 100 shards took some
#: 500 round trips a side table by table (a savepoint, the query, its release), 0.6 s at 8192 shards.
TABLES_PER_STATEMENT = 100


def _native_in_one(conn: psycopg.Connection[Any], items: Sequence[tuple[str, str, list[ColumnHash]]]) -> list[tuple[int, str]] | None:
    """checksums() of (schema, table, columns) items in the native form, in one statement, in their order; None
    when one of them cannot take that form on this side (the caller then goes table by table, as checksums does)."""
    if not items:
        return []
    sql = " UNION ALL ".join(f"SELECT {k}, c.* FROM ({checksum_sql(schema, table, cols)}) AS c" for k, (schema, table, cols) in enumerate(items))
    try:
        with conn.transaction():  # a savepoint inside the caller's snapshot
            got = {int(r[0]): (int(r[1]), str(r[2])) for r in conn.execute(sql)}
    except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedColumn):
        return None
    return [got[k] for k in range(len(items))]


def _checksums_of(
    conn: psycopg.Connection[Any], pairs: Sequence[tuple[str, Sequence[str], dict[str, list[ColumnHash]]]],
) -> list[tuple[dict[str, tuple[int, str]], dict[str, int]]]:
    """checksums() of each (schema, tables, columns) of a batch, TABLES_PER_STATEMENT tables at a time in one
    statement; a run with a table the native form does not fit goes shard by shard through checksums()."""
    conn.execute(VERIFY_SETTINGS.replace("SET ", "SET LOCAL ") if not conn.autocommit else VERIFY_SETTINGS)
    out: list[tuple[dict[str, tuple[int, str]], dict[str, int]]] = []
    start = 0
    while start < len(pairs):
        end, n = start, 0
        while end < len(pairs) and (n == 0 or n + len(pairs[end][1]) <= TABLES_PER_STATEMENT):
            n += len(pairs[end][1])
            end += 1
        run = pairs[start:end]
        sums = _native_in_one(conn, [(schema, t, cols.get(t, [])) for schema, tables, cols in run for t in tables])
        for schema, tables, cols in run:
            if sums is None:
                out.append(checksums(conn, schema, tables, cols))
            else:
                out.append((dict(zip(tables, sums[:len(tables)], strict=True)), dict.fromkeys(tables, NATIVE)))
                sums = sums[len(tables):]
        start = end
    return out


def compare_many(
    source: psycopg.Connection[Any],
    target: psycopg.Connection[Any],
    pairs: Sequence[tuple[str, str, Sequence[str]]],
    *,
    when: str = "at the cutover point",
) -> Verification:
    """compare() for a batch: (source schema, target schema, tables) per shard, one catalog read for all and both
    sides at once; the tables named schema-qualified (by the target's schema)."""
    columns = column_hashes_of(source, [p[0] for p in pairs])

    def side(conn: psycopg.Connection[Any], mine: int) -> list[tuple[dict[str, tuple[int, str]], dict[str, int]]]:
        return _checksums_of(conn, [(p[0] if mine == 0 else p[1], p[2], columns[p[0]]) for p in pairs])

    with ThreadPoolExecutor(max_workers=2) as pool:
        fs, ft = pool.submit(side, source, 0), pool.submit(side, target, 1)
        s_all, t_all = fs.result(), ft.result()
    checks = []
    for (src_schema, tgt_schema, tables), (s, s_form), (t, t_form) in zip(pairs, s_all, t_all, strict=True):
        for sums, schema, conn, mine, theirs in ((s, src_schema, source, s_form, t_form), (t, tgt_schema, target, t_form, s_form)):
            redo = {name: theirs[name] for name in tables if theirs[name] > mine[name]}
            if redo:
                sums.update(checksums(conn, schema, sorted(redo), columns[src_schema], forms=redo)[0])
        checks += [TableCheck(f"{tgt_schema}.{name}", s[name][0], t[name][0], s[name][1], t[name][1]) for name in tables]
    return Verification(checks, when=when)

