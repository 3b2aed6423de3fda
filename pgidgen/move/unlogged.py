"""Unlogged tables in an online move.

Logical decoding never sees an unlogged table's rows (they are not written to the WAL), so a publication cannot
hold one and the catch-up cannot carry its changes. An online move leaves them out of the publication, copies them
with the rest at the snapshot (which the application's writes since then make stale), and copies them again inside
the cutover's pause, where the source's writes are frozen: emptied on the target, then every row, in one target
transaction committed before the flip. Their size adds to the pause (the pause's budget, --max-pause, does not stop
it); unlogged tables hold what an app can lose, such as sessions or caches, and are small as a rule.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from . import sqltext as q
from .transfer import plan_tables


def copy_unlogged(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], tables: Sequence[tuple[str, str]]) -> int:
    """The rows of tables ((schema, name), the same names on both sides) from src's open transaction (under the
    freeze) into tgt, replacing what tgt holds, in one tgt transaction. Returns the rows copied."""
    by_schema: dict[str, list[str]] = {}
    for schema, name in tables:
        by_schema.setdefault(schema, []).append(name)
    plans = [t for schema, names in by_schema.items() for t in plan_tables(src, tgt, schema, names, into=schema)]
    copied = 0
    with tgt.transaction():
        # the target's own triggers on them (its post-data) stay silent, as during the first copy, which ran before them
        triggers = tgt.execute(
            "SELECT n.nspname, c.relname, t.tgname, t.tgenabled::text FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE NOT t.tgisinternal AND t.tgenabled <> 'D'"
            " AND (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([s for s, _ in tables], [n for _, n in tables])).fetchall()
        for schema, name, trigger, _ in triggers:
            tgt.execute(f"ALTER TABLE {q.ident(schema, name)} DISABLE TRIGGER {q.ident(trigger)}")
        tgt.execute(f"TRUNCATE ONLY {', '.join(q.ident(schema, name) for schema, name in tables)}")  # together: foreign keys among them
        for t in plans:
            writer = tgt.cursor()
            with src.cursor().copy(q.copy_out_sql(t.schema, t.name, binary=t.binary, columns=t.columns)) as out, \
                    writer.copy(q.copy_in_sql(t.schema, t.name, binary=t.binary, freeze=False, columns=t.columns)) as into:
                for block in out:
                    into.write(block)
            copied += max(writer.rowcount, 0)
        for schema, name, trigger, enabled in triggers:  # as it was: O, or ENABLE ALWAYS / REPLICA
            how = {"A": "ENABLE ALWAYS", "R": "ENABLE REPLICA"}.get(enabled, "ENABLE")
            tgt.execute(f"ALTER TABLE {q.ident(schema, name)} {how} TRIGGER {q.ident(trigger)}")
    return copied
