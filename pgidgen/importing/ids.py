"""`--ids next_id`: which column of each imported table takes its IDs from next_id(), and the proof that no ID
kept from the source can ever collide with one next_id() returns.

The proof: next_id() of any shard returns IDs whose time field is at least its server's clock when it is called
(the generator never goes back), so every ID it may return from now on is >= Layout.min_id(now), the bound.
An existing ID below the bound can never be made again. The bound is taken with the slowest target's clock,
checked against every table's max(ID) before anything is written, and again at the cutover against the rows
that arrived while the import followed the source.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..config import Config
from ..db import connect, pg_message
from ..errors import ConflictError, DatabaseError, InputError
from ..layout import Layout, iso_ms

#: the values --ids takes: "next_id" (the key tables' integer primary keys default to next_id()); None keeps them
ID_SOURCES = ("next_id",)

_PRIMARY_KEYS_SQL = """
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attidentity,
       (SELECT s.relname FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class s ON s.oid = d.objid
         WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = c.oid AND d.refobjsubid = a.attnum
           AND d.deptype = 'i' AND s.relkind = 'S')
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary AND i.indnkeyatts = 1
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
WHERE n.nspname = %s AND c.relname = ANY(%s)
ORDER BY c.relname
"""


@dataclass
class IdColumns:
    #: table -> its bigint primary key column, whose default becomes next_id()
    columns: dict[str, str]
    #: tables whose ID column is an identity column (DROP IDENTITY first; its sequence goes with it)
    identity: list[str]
    #: the identity columns' sequences: not carried over to the shards, they are dropped
    identity_sequences: list[str]
    #: table -> why it keeps its primary key's default (said in the dry run)
    kept: dict[str, str]


def id_columns(source: psycopg.Connection[Any], *, schema: str, key: str, tables: Sequence[str]) -> IdColumns:
    """Each table's single-column integer primary key; a smallint or integer one is refused (next_id() makes bigints)."""
    found = IdColumns({}, [], [], {})
    by_table = {r[0]: r[1:] for r in source.execute(_PRIMARY_KEYS_SQL, (schema, list(tables)))}
    for name in tables:
        if name not in by_table:
            found.kept[name] = "no single-column primary key"
            continue
        column, typ, identity, sequence = by_table[name]
        if column == key:
            found.kept[name] = f"its primary key is the shard key {key} (a next_id() value would route to another shard)"
        elif typ in ("smallint", "integer"):
            raise InputError(f"{schema}.{name}.{column} is {typ}, and next_id() makes bigint IDs", where="the source",
                             hint=f"widen it first (ALTER TABLE {sql.Identifier(schema, name).as_string(None)} ALTER COLUMN"
                                  f" {sql.Identifier(column).as_string(None)} TYPE bigint), or import without --ids next_id")
        elif typ != "bigint":
            found.kept[name] = f"its primary key {column} is {typ}, not an integer"
        else:
            found.columns[name] = column
            if identity:
                found.identity.append(name)
                if sequence:
                    found.identity_sequences.append(str(sequence))
    return found


def id_bound(config: Config, databases: Sequence[str]) -> int:
    """The smallest ID next_id() may return from now on, on any shard of these databases: min_id of the slowest
    server's clock, read as next_id() reads it."""
    clocks = []
    for name in databases:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                row = conn.execute("SELECT pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::pg_catalog.int8").fetchone()
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while reading its clock: {pg_message(e)}") from None
            assert row is not None
            clocks.append(int(row[0]))
    return config.layout.min_id(min(clocks))


def largest_ids(source: psycopg.Connection[Any], *, schema: str, columns: dict[str, str]) -> dict[str, int | None]:
    """max(ID) per table, one query each (an index scan on the primary key)."""
    out: dict[str, int | None] = {}
    for table, column in columns.items():
        q = sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(column), sql.Identifier(schema, table))
        row = source.execute(q).fetchone()
        out[table] = None if row is None or row[0] is None else int(row[0])
    return out


def prove(source: psycopg.Connection[Any], layout: Layout, *, schema: str, columns: dict[str, str], bound: int) -> dict[str, int | None]:
    """Refuses the first table holding an ID at or above the bound; the tables' largest IDs otherwise."""
    largest = largest_ids(source, schema=schema, columns=columns)
    for table, top in largest.items():
        if top is not None and top >= bound:
            raise ConflictError(f"{schema}.{table}.{columns[table]} holds IDs up to {top}, and next_id() may return any ID from {bound} on"
                                f" (made at {iso_ms(layout.decode(bound)[0])}): they could collide", where="the source",
                                hint="import without --ids next_id (the table keeps its own IDs), or renumber its rows below that bound first")
    return largest

