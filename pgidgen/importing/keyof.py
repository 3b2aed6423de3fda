"""--key-of: tables that reach the key through a foreign key (`likes=photo_id:photos.id`), read and refused.

A row of such a table has no key column; its key is the key of the parent row whose PARENTCOL equals the row's
COLUMN. The parent holds the key column itself, or is routed by --key-of in turn (a chain: comments -> likes ->
photos), in which case PARENTCOL is its one-column primary key (its rows' shards are kept by it, settle.py).
Refused up front, each with one line: a spelling that is not TABLE=COLUMN:PARENT.PARENTCOL, an unknown table or
column, a parent that is the table itself, skipped, or neither with the key nor routed, a chain that comes back
on itself, a PARENTCOL that is not unique (or, on a routed parent, not its primary key), a child column with NULLs
or values no parent has, and a child without a primary key (its rows are found again by it when they change).
settle.py routes the rows.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..errors import InputError

_SPELLING = re.compile(r"^([^=:.,\s]+)=([^=:.,\s]+):([^=:.,\s]+)\.([^=:.,\s]+)$")


@dataclass(frozen=True)
class KeyOf:
    table: str
    column: str
    parent: str
    parent_column: str


def parse_key_of(values: Iterable[str]) -> dict[str, KeyOf]:
    """--key-of values (repeated, or comma-separated) -> table -> its route."""
    out: dict[str, KeyOf] = {}
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            m = _SPELLING.match(part)
            if m is None:
                raise InputError(f"--key-of {part} is not TABLE=COLUMN:PARENT.PARENTCOL",
                                 hint="e.g. --key-of likes=photo_id:photos.id (a like's key is the key of the photo whose id is its photo_id)")
            k = KeyOf(*m.groups())
            if k.table in out:
                raise InputError(f"--key-of names table {k.table} twice", hint="give each table one route")
            out[k.table] = k
    return out


def _columns(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (sql.Identifier(schema, table).as_string(conn),))]


def _primary_key(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    row = conn.execute(
        "SELECT pg_catalog.array_agg(a.attname::text ORDER BY pg_catalog.array_position(i.indkey::int2[], a.attnum)) FROM pg_catalog.pg_index i"
        " JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (sql.Identifier(schema, table).as_string(conn),)).fetchone()
    return list(row[0]) if row and row[0] else []


def check_key_of(conn: psycopg.Connection[Any], *, schema: str, key: str, routes: dict[str, KeyOf], tables: Sequence[str],
                 skip: Sequence[str], has_key: dict[str, bool], read_rows: bool = True) -> dict[str, list[str]]:
    """The refusals, in the order a reader would check by hand; returns each key-of table's primary key columns.
    read_rows=False: the catalog's refusals only (--owner-sql, for a role that may not read the rows yet)."""
    pks: dict[str, list[str]] = {}
    for k in routes.values():
        where = f"{schema}.{k.table}"
        for name in (k.table, k.parent):
            if name not in tables:
                raise InputError(f"--key-of {k.table}: {name} is not a table of schema {schema}", where="the source", hint="give the tables' names as \\dt lists them")
            if name in skip:
                raise InputError(f"--key-of {k.table}: table {name} is in --skip", where="the source", hint="a routed table and its parent are both imported")
        if k.parent == k.table:
            raise InputError(f"--key-of {k.table}: its parent is the table itself", where="the source",
                             hint="a self-reference has no key to follow: route the table by a parent that holds the key")
        if has_key[k.table]:
            raise InputError(f"--key-of {k.table}: {where} has the key column {key} itself", where="the source", hint=f"leave {k.table} out of --key-of")
        if not has_key[k.parent] and k.parent not in routes:
            raise InputError(f"--key-of {k.table}: its parent {schema}.{k.parent} has no column {key}", where="the source",
                             hint=f"route {k.parent} too (--key-of {k.parent}=COLUMN:PARENT.PARENTCOL), or name a parent that holds the key")
        chain = [k.table, k.parent]
        while chain[-1] in routes and not has_key.get(chain[-1], False):
            chain.append(routes[chain[-1]].parent)
            if chain[-1] in chain[:-1]:
                raise InputError(f"--key-of {k.table}: its parents come back on themselves ({' -> '.join(chain)})", where="the source",
                                 hint=f"a chain of --key-of ends at a table with the column {key}")
        if k.column not in _columns(conn, schema, k.table):
            raise InputError(f"--key-of {k.table}: {where} has no column {k.column}", where="the source", hint="name the column that refers to the parent")
        if k.parent_column not in _columns(conn, schema, k.parent):
            raise InputError(f"--key-of {k.table}: {schema}.{k.parent} has no column {k.parent_column}", where="the source",
                             hint="name the parent's column the child's refers to")
        unique = conn.execute(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = %s)",
            (sql.Identifier(schema, k.parent).as_string(conn), k.parent_column)).fetchone()
        if not unique or not unique[0]:
            raise InputError(f"--key-of {k.table}: {schema}.{k.parent}.{k.parent_column} is not unique", where="the source",
                             hint="a child row must find one parent: route by a column with a primary key or unique index of its own")
        if k.parent in routes and _primary_key(conn, schema, k.parent) != [k.parent_column]:
            raise InputError(f"--key-of {k.table}: {schema}.{k.parent}.{k.parent_column} is not the primary key of {k.parent}, which is routed by --key-of",
                             where="the source", hint=f"a routed parent's rows are found by their primary key: route {k.table} by a column that refers to it")
        pk = _primary_key(conn, schema, k.table)
        if not pk:
            raise InputError(f"--key-of {k.table}: {where} has no primary key", where="the source",
                             hint="its rows are routed again by primary key when they change: add one")
        pks[k.table] = pk
        if not read_rows:
            continue
        col, child, parent = sql.Identifier(k.column), sql.Identifier(schema, k.table), sql.Identifier(schema, k.parent)
        nulls = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} IS NULL)").format(child, col)).fetchone()
        if nulls and nulls[0]:
            raise InputError(f"--key-of {k.table}: {where}.{k.column} holds NULLs", where="the source",
                             hint="a row with no parent has no shard: give those rows a parent, or delete them")
        orphan = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {} c WHERE NOT EXISTS (SELECT FROM {} p WHERE p.{} = c.{}))").format(
            child, parent, sql.Identifier(k.parent_column), col)).fetchone()
        if orphan and orphan[0]:
            raise InputError(f"--key-of {k.table}: rows of {where} have a {k.column} no {k.parent}.{k.parent_column} has", where="the source",
                             hint="a row with no parent has no shard: delete those rows, or add a foreign key and fix them")
    return pks
