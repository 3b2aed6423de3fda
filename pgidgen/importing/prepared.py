"""A source whose tables pgidgen's role does not own: their owner prepares it once, then the import runs with a role
that has REPLICATION and SELECT only (and writes nothing but pgidgen's own journal, heartbeat and gate).

What needs the tables' owner, the owner's SQL makes beforehand (`pgidgen import --owner-sql` renders it from the
plan): the publications, the replica identity FULL some tables need, pgidgen's schema (journal, heartbeat), and the
gate. The gate stands in for the cutover's LOCK and write-refusing trigger, which the import's role may not take or
make: a statement trigger on every imported table, from the preparation on, whose function (SECURITY DEFINER)
- takes a shared transaction-level advisory lock, so a write waits while the cutover holds that lock exclusively,
  and the cutover's lock waits for every transaction that has written (they hold theirs to their end);
- then reads a sequence, the gate: a sequence, not a row, because its value is not bound to a snapshot (a
  REPEATABLE READ transaction begun before the cutover sees the gate shut too). The cutover's transaction sets it
  to its own transaction ID, and the gate is shut unless that transaction aborted: a setval is not undone with its
  transaction, and a cutover killed before its commit (kill -9, a lost connection) would otherwise have left the
  application's writes refused until someone ran --resume or --rollback. Once the cutover committed, the import
  sets it to 1: shut for good, whatever becomes of that transaction's status.
The import's role may set the gate (UPDATE on that sequence, granted by the preparation); the trigger's function
and the lock it waits on are the owner's.

After the import the publications and the replica identity are the owner's to take back (`--owner-sql --rollback`
prints the SQL, which the preparation stored: the identities it changed, as they were); the gate stays shut, so
writes to the source's tables go on failing with the message that says where their rows went.
"""
from __future__ import annotations

import json
import re
import zlib
from typing import Any

import psycopg
from psycopg import sql

from ..errors import ConflictError, InputError
from . import sqltext
from .source import WORK_SCHEMA, ImportPlan

TRIGGER = "pgidgen_gate"
#: the advisory lock's first key: 'pgim', not pgidgen's own class (idgen.LOCK_CLASS), so that the second (the
#: imported schema's CRC) never meets a shard's lock on a source that is a pgidgen database too
LOCK_CLASS = 0x7067696D


def _q(*parts: str) -> str:
    return sql.Identifier(*parts).as_string(None)


def _lit(value: str) -> str:
    return sql.Literal(value).as_string(None)


def lock_keys(schema: str) -> tuple[int, int]:
    crc = zlib.crc32(schema.encode())
    return LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc


def publications_sql(plan: ImportPlan) -> str:
    """Every target's publication: what the preparation made, compared with the plan when the import starts."""
    return "".join(sqltext.publication_sql(plan, n) for n in plan.targets)


def _tables(plan: ImportPlan) -> list[str]:
    return [_q(plan.schema, t.name) for t in plan.tables]


def _shown(name: str) -> str:
    """A name in an SQL comment: quoted, on one line (a newline in it would end the comment)."""
    return _q(name).replace("\n", "\\n").replace("\r", "\\r")


def _each_relation(plan: ImportPlan, body: str) -> str:
    """A DO block running body (a format() string, %s the relation) for every imported table and its partitions:
    a statement trigger on a partitioned table does not fire for writes made to a partition, and pg_dump locks
    each partition it dumps."""
    rels = f"pg_catalog.unnest(ARRAY[{', '.join(_lit(t) for t in _tables(plan))}]::pg_catalog.regclass[]) AS p (rel)"
    return (f"DO $pgidgen$ DECLARE r pg_catalog.regclass; BEGIN\n"  # pg_partition_tree has no row for a plain table
            f"    FOR r IN SELECT p.rel FROM {rels} UNION SELECT t.relid FROM {rels}, LATERAL pg_catalog.pg_partition_tree(p.rel) AS t LOOP\n"
            f"        EXECUTE pg_catalog.format({_lit(body)}, r);\n    END LOOP;\nEND $pgidgen$;")


def _leftovers(plan: ImportPlan) -> str:
    """A DO block dropping every gate trigger in the schema and every publication of an import from this source:
    a preparation made again, for other tables or another shard map, leaves none of the last one's behind."""
    return (f"DO $pgidgen$ DECLARE r record; BEGIN\n"
            f"    FOR r IN SELECT t.tgrelid::pg_catalog.regclass AS rel FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
            f" WHERE t.tgname = {_lit(TRIGGER)} AND c.relnamespace = {_lit(_q(plan.schema))}::pg_catalog.regnamespace LOOP\n"
            f"        EXECUTE pg_catalog.format('DROP TRIGGER {TRIGGER} ON %s', r.rel);\n    END LOOP;\n"
            f"    FOR r IN SELECT pubname FROM pg_catalog.pg_publication WHERE pubname LIKE {_lit(f'pgidgen_import_{plan.source_oid}_%')} LOOP\n"
            f"        EXECUTE pg_catalog.format('DROP PUBLICATION %I', r.pubname);\n    END LOOP;\nEND $pgidgen$;")


def undo_sql(plan: ImportPlan, *, cut_over: bool) -> str:
    """The owner's SQL that takes the preparation back: before an import (or after its rollback) all of it; after
    its cutover only the publications and the replica identities (the gate stays shut: writes keep failing)."""
    if cut_over:  # the gate's triggers stay
        out = [f"DROP PUBLICATION IF EXISTS {_q(plan.slot(n))};" for n in plan.targets]
    else:
        out = [_leftovers(plan), f"DROP SCHEMA IF EXISTS {_q(WORK_SCHEMA)} CASCADE;"]
    out += [f"ALTER TABLE {rel} REPLICA IDENTITY {clause};" for rel, clause in plan.full_identity.items()]
    return "\n".join(out) + "\n"


def owner_sql(plan: ImportPlan, role: str) -> str:
    """The preparation, one transaction, run by the tables' owner; running it again (after the shard map or the
    tables changed) makes it anew."""
    w, r = _q(WORK_SCHEMA), _q(role)
    k1, k2 = lock_keys(plan.schema)
    where_to = f"{plan.shard_count} shards on {', '.join(plan.targets)}"
    rest = f" was imported into pgidgen's shards ({where_to}; shard = {plan.key} % {plan.shard_count}): write through the Router, not to this table"
    message = "%I.%I" + rest.replace("%", "%%")
    out = [
        f"-- pgidgen import of schema {_shown(plan.schema)}: the source's preparation, for its tables' owner to run once (one transaction):",
        "--   psql \"$OWNER_DSN\" -v ON_ERROR_STOP=1 -f THIS_FILE",
        f"-- then pgidgen import runs as {_shown(role)} (REPLICATION, and SELECT on these tables). Writes to the tables pass a gate from now on.",
        "-- Each table's lock is waited for at most 2 s (the application is never queued behind this script): should it stop",
        "-- on a lock timeout, nothing is changed; run it again.",
        "BEGIN;",
        "SET LOCAL lock_timeout = '2s';",
        f"CREATE SCHEMA IF NOT EXISTS {w};",
        f"CREATE TABLE IF NOT EXISTS {w}.journal (schema_name text PRIMARY KEY, step text NOT NULL, plan jsonb NOT NULL, dump text,"
        " started_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());",
        f"CREATE TABLE IF NOT EXISTS {w}.heartbeat (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());",
        f"CREATE TABLE IF NOT EXISTS {w}.prepared (schema_name text PRIMARY KEY, role text NOT NULL, publications text NOT NULL,"
        " full_identity jsonb NOT NULL, undo text NOT NULL, undo_cut_over text NOT NULL);",
        f"CREATE SEQUENCE IF NOT EXISTS {w}.gate MINVALUE 0 START 0;",
        f"CREATE OR REPLACE FUNCTION {w}.gate() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $body$\n"
        f"DECLARE shut bigint;\n"
        f"BEGIN\n    PERFORM pg_catalog.pg_advisory_xact_lock_shared({k1}, {k2});\n"
        f"    shut := (SELECT last_value FROM {w}.gate);  -- 0 open, 1 shut, else the cutover's transaction: shut unless it aborted\n"
        f"    IF shut = 1 OR (shut > 1 AND pg_catalog.pg_xact_status(shut::text::pg_catalog.xid8) IS DISTINCT FROM 'aborted') THEN\n"
        f"        RAISE EXCEPTION USING ERRCODE = 'read_only_sql_transaction', MESSAGE = pg_catalog.format({_lit(message)}, TG_TABLE_SCHEMA, TG_TABLE_NAME);\n"
        f"    END IF;\n    RETURN NULL;\nEND\n$body$;",
        f"REVOKE ALL ON FUNCTION {w}.gate() FROM PUBLIC;",
    ]
    out.append(_leftovers(plan))
    out.append(_each_relation(plan, f"CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION {w}.gate()"))
    out += sqltext.identity_full_sql(plan).splitlines()
    out += publications_sql(plan).splitlines()
    out += [
        f"GRANT USAGE ON SCHEMA {_q(plan.schema)}, {w} TO {r};",
        _each_relation(plan, f"GRANT SELECT ON %s TO {r}"),
        f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA {_q(plan.schema)} TO {r};",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {w}.journal, {w}.heartbeat TO {r};",
        f"GRANT SELECT ON {w}.prepared TO {r};",
        f"GRANT SELECT, UPDATE ON SEQUENCE {w}.gate TO {r};",
        f"INSERT INTO {w}.prepared VALUES ({_lit(plan.schema)}, {_lit(role)}, {_lit(publications_sql(plan))},"
        f" {_lit(json.dumps(plan.full_identity))}, {_lit(undo_sql(plan, cut_over=False))}, {_lit(undo_sql(plan, cut_over=True))})"
        " ON CONFLICT (schema_name) DO UPDATE SET role = EXCLUDED.role, publications = EXCLUDED.publications,"
        " full_identity = EXCLUDED.full_identity, undo = EXCLUDED.undo, undo_cut_over = EXCLUDED.undo_cut_over;",
        "COMMIT;",
    ]
    return "\n".join(out) + "\n"


def check(conn: psycopg.Connection[Any], plan: ImportPlan) -> None:
    """Before anything is written: the preparation made for this plan (the same targets, shards, tables and key),
    and for this role."""
    row = conn.execute(sql.SQL("SELECT publications, role, role = current_user FROM {} WHERE schema_name = %s").format(
        sql.Identifier(WORK_SCHEMA, "prepared")), (plan.schema,)).fetchone()
    if row is not None and not row[2]:
        raise ConflictError(f"the source was prepared for an import by role {row[1]}, not this one", where="the source",
                            hint="connect as that role, or have the owner run the SQL pgidgen import --owner-sql prints as this one")
    if row is None or row[0] != publications_sql(plan):
        raise ConflictError(f"the source was prepared for another import of schema {plan.schema} (its tables, key or shard map differ)",
                            where="the source", hint="have the tables' owner run the SQL pgidgen import --owner-sql prints now, then import again")


def undo_for(conn: psycopg.Connection[Any], schema: str, step: str | None) -> str:
    """The stored undo for the owner (--owner-sql --rollback); refused while an import is under way."""
    if step is not None and step != "done":
        raise ConflictError(f"an import of schema {schema} is under way", where="the source",
                            hint="roll it back first (pgidgen import --rollback), or finish it (--resume)")
    made = conn.execute("SELECT pg_catalog.to_regclass(%s)", (f"{WORK_SCHEMA}.prepared",)).fetchone() != (None,)
    row = conn.execute(sql.SQL("SELECT undo, undo_cut_over FROM {} WHERE schema_name = %s").format(sql.Identifier(WORK_SCHEMA, "prepared")),
                       (schema,)).fetchone() if made else None
    if row is None:
        raise InputError(f"the source was not prepared for an import of schema {schema}", where="the source", hint="there is nothing to undo")
    return str(row[1] if step is not None else row[0])


def close_sql(plan: ImportPlan) -> tuple[str, str]:
    """The cutover's two statements: the gate's lock (under lock_timeout, retried), then the gate shut by this
    transaction (open again should it abort)."""
    k1, k2 = lock_keys(plan.schema)
    return (f"SELECT pg_catalog.pg_advisory_xact_lock({k1}, {k2});",
            f"SELECT pg_catalog.setval({_lit(_q(WORK_SCHEMA, 'gate'))}, pg_catalog.pg_current_xact_id()::text::bigint);")


def open_sql() -> str:
    return f"SELECT pg_catalog.setval({_lit(_q(WORK_SCHEMA, 'gate'))}, 0);\n"


def shut_sql() -> str:
    """Once the cutover committed: shut for good (its transaction's status is forgotten some day)."""
    return f"SELECT pg_catalog.setval({_lit(_q(WORK_SCHEMA, 'gate'))}, 1);\n"


def forget_sql(schema: str) -> str:
    """A rollback's, on a prepared source: the gate open, the journal and heartbeats gone (the owner's objects stay)."""
    w = _q(WORK_SCHEMA)
    return (open_sql() + f"DELETE FROM {w}.journal WHERE schema_name = {_lit(schema)};\nDELETE FROM {w}.heartbeat;\n")


def strip_dump(text: str, plan: ImportPlan) -> str:
    """The source's dump without what the preparation added to its tables: the gate's triggers, and the replica
    identity FULL it set; the shards' tables get the source's own back at the end (a USING INDEX one after its
    index is made: pg_dump writes it there, and wrote none, the identity being FULL)."""
    text = re.sub(rf"^CREATE TRIGGER {TRIGGER} .*\n", "", text, flags=re.M)
    own = []
    for rel, clause in plan.full_identity.items():
        text = re.sub(rf"^ALTER TABLE ONLY {re.escape(rel)} REPLICA IDENTITY FULL;\n", "", text, flags=re.M)
        if clause != "DEFAULT":
            own.append(f"ALTER TABLE ONLY {rel} REPLICA IDENTITY {clause};\n")
    return text + "".join(own)
