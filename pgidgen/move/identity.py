"""Replica identity for the move: tables without a primary key move online all the same.

An online move publishes the shard's tables, and a published table without a replica identity refuses UPDATE
and DELETE on the source; the target's apply worker finds the rows those change by the identity's columns. A
table whose identity would not do (no primary key, REPLICA IDENTITY NOTHING, FULL over a column without
equality) gets one for as long as the move publishes it: its primary key (DEFAULT), else a unique index that
PostgreSQL accepts as one (unique, immediate, valid, not partial, no expressions, its key columns NOT NULL),
else FULL (the whole old row, matched column by column on the target: its columns need equality).

What is changed is journaled with the move before anything is (detail "identity": per shard schema, each table
with the identity it had and the one it has during the move), set on the source before the publication and
the slot, and on the target's copy right after its schema (pg_dump copies whatever the source had when it
read it; the cutover compares the two), then put back as it was on both copies when the move is done
(`identity`, after the verification's reads) or on the source when it is rolled back. Each step reads what
stands and changes only what differs, so a resume or a second rollback does the rest.

ALTER TABLE ... REPLICA IDENTITY takes an ACCESS EXCLUSIVE lock: on a table the application uses, every try
waits at most LOCK_TRY_MS and the next comes after a growing sleep with jitter, until LOCK_WAIT_S, then a
one-line error naming who held the lock (GitLab's WithLockRetries): a queued ALTER never stalls the application
for longer than one try.
"""
from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..errors import ConflictError
from .sqltext import ident

#: One try's lock_timeout, and the sleeps between tries (doubling, with jitter), until LOCK_WAIT_S in all.
LOCK_TRY_MS = 100
FIRST_SLEEP_S, LAST_SLEEP_S = 0.05, 2.0
LOCK_WAIT_S = 60.0

_WORDS = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}


@dataclass(frozen=True)
class Identity:
    """A table's replica identity: kind d (DEFAULT: its primary key), n (NOTHING), f (FULL), i (USING INDEX index)."""

    kind: str
    index: str | None = None

    @property
    def code(self) -> str:
        """As journaled: d, n, f, or i:<index name>."""
        return f"i:{self.index}" if self.kind == "i" else self.kind

    @classmethod
    def parse(cls, code: str) -> Identity:
        return cls("i", code[2:]) if code.startswith("i:") else cls(code)

    @property
    def sql(self) -> str:
        return f"USING INDEX {ident(self.index or '')}" if self.kind == "i" else _WORDS[self.kind]

    def __str__(self) -> str:
        return f"USING INDEX {self.index}" if self.kind == "i" else _WORDS[self.kind]


@dataclass(frozen=True)
class Keys:
    """What a table offers as a replica identity, as read by IDENTITY_COLUMNS_SQL."""

    identity: Identity  # as it stands (an 'i' whose index is gone has index None)
    primary_key: bool  # a valid, immediate primary key: what DEFAULT uses
    unique_index: str | None  # the first unique index PostgreSQL would take as REPLICA IDENTITY USING INDEX

    @property
    def full_decides(self) -> bool:
        """Whether FULL is (or would be, for the move) the identity, so the columns' equality decides."""
        k = self.identity
        if k.kind == "f":
            return True
        if k.kind == "d" and self.primary_key or k.kind == "i" and k.index:
            return False
        return not self.primary_key and self.unique_index is None


def works(keys: Keys, unequal: Sequence[str]) -> bool:
    """Whether the table's identity as it stands lets the target apply updates and deletes."""
    k = keys.identity
    return k.kind == "d" and keys.primary_key or k.kind == "i" and k.index is not None or k.kind == "f" and not unequal


def for_move(keys: Keys, unequal: Sequence[str]) -> Identity | None:
    """The identity a table gets for an online move; None when its own works (or none would: see movable)."""
    if works(keys, unequal):
        return None
    if keys.primary_key:
        return Identity("d")
    if keys.unique_index:
        return Identity("i", keys.unique_index)
    return None if unequal else Identity("f")


def movable(keys: Keys, unequal: Sequence[str]) -> bool:
    """Whether the target could apply updates and deletes, with the table's identity or the move's."""
    return works(keys, unequal) or for_move(keys, unequal) is not None


#: Per table (c, its pg_class row): the index its REPLICA IDENTITY USING INDEX names, whether it has a primary key
#: that DEFAULT uses (valid and immediate, as the relation cache requires), and the unique index PostgreSQL would
#: take as REPLICA IDENTITY USING INDEX (ATExecReplicaIdentity's rules: unique, immediate, not partial, no
#: expressions, every key column NOT NULL; and valid), fewest key columns first, then by name.
IDENTITY_COLUMNS_SQL = """
       (SELECT ic.relname::text FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
        WHERE i.indrelid = c.oid AND i.indisreplident LIMIT 1),
       EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary AND i.indisvalid AND i.indimmediate),
       (SELECT ic.relname::text FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
        WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
          AND NOT EXISTS (SELECT FROM pg_catalog.generate_series(0, i.indnkeyatts - 1) k
                          LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[k]
                          WHERE i.indkey[k] <= 0 OR a.attnotnull IS NOT TRUE)
        ORDER BY i.indnkeyatts, ic.relname LIMIT 1)"""


def keys_of(relreplident: str, index: str | None, primary_key: bool, unique_index: str | None) -> Keys:
    return Keys(Identity(relreplident, index if relreplident == "i" else None), bool(primary_key), unique_index)


#: Per column, the type whose equality counts: domains by their base type, arrays by their element's (array
#: equality needs the element's), all the way down (a NOT NULL domain could not even be cast NULL to).
_EQUALITY_TYPES_SQL = """
WITH RECURSIVE col AS (
    SELECT a.attnum, a.attname::text AS name, a.atttypid AS t, 0 AS depth FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = %(rel)s::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT col.attnum, col.name, CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE ty.typelem END, col.depth + 1
    FROM col JOIN pg_catalog.pg_type ty ON ty.oid = col.t
    WHERE col.depth < 16 AND (ty.typtype = 'd' OR ty.typcategory = 'A' AND ty.typelem <> 0)
)
SELECT DISTINCT ON (attnum) name, pg_catalog.format_type(t, NULL) FROM col ORDER BY attnum, depth DESC
"""


def unequal_columns(conn: psycopg.Connection[Any], schema: str, table: str, verdict: dict[str, bool] | None = None) -> tuple[str, ...]:
    """The columns of a table whose type has no equality as the target's apply worker looks it up under
    REPLICA IDENTITY FULL (the type cache: a default btree or hash operator class, binary-coercible ones
    included; domains by their base type; composites and arrays by their parts). array_position() asks the type
    cache the very same question, so it is the probe: it fails for json, point, xml, domains over them,
    composites holding them. verdict: per type, what earlier probes found (shared across tables)."""
    bad: list[str] = []
    verdict = {} if verdict is None else verdict
    for name, typ in conn.execute(_EQUALITY_TYPES_SQL, {"rel": ident(schema, table)}).fetchall():
        if typ not in verdict:
            try:
                with conn.transaction():
                    conn.execute(f"SELECT pg_catalog.array_position(ARRAY[NULL::{typ}], NULL::{typ})")
                verdict[typ] = True
            except psycopg.errors.UndefinedFunction:  # no equality at all
                verdict[typ] = False
            except psycopg.Error as e:
                verdict[typ] = getattr(e, "sqlstate", "") not in ("42883", "0A000")
        if not verdict[typ]:
            bad.append(name)
    return tuple(bad)


@dataclass(frozen=True)
class Change:
    """One table's replica identity: what it was, what it is during the move."""

    table: str
    was: Identity
    during: Identity

    def describe(self, schema: str) -> str:
        return f"{schema}.{self.table} ({lacking(self.was)}): REPLICA IDENTITY {self.during} for the move, {self.was} before and after"


def lacking(was: Identity) -> str:
    """Why a table's identity would not do for a move, in a few words."""
    return {"d": "no primary key", "n": "REPLICA IDENTITY NOTHING", "f": "REPLICA IDENTITY FULL over a column without equality",
            "i": "its replica identity index is gone"}[was.kind]


def journal_form(changes: dict[str, list[Change]]) -> dict[str, list[list[str]]]:
    """Per shard schema: [table, was, during] with the identities' codes (Identity.code)."""
    return {schema: [[c.table, c.was.code, c.during.code] for c in items] for schema, items in changes.items() if items}


def from_journal(detail: dict[str, Any]) -> dict[str, list[Change]]:
    return {schema: [Change(t, Identity.parse(was), Identity.parse(during)) for t, was, during in items]
            for schema, items in (detail.get("identity") or {}).items()}


def alter_sql(schema: str, table: str, identity: Identity) -> str:
    return f"ALTER TABLE {ident(schema, table)} REPLICA IDENTITY {identity.sql};\n"


def render(schema: str, changes: Iterable[Change], *, back: bool = False) -> str:
    """The ALTER TABLE statements that set the move's identities (back: the original ones) in schema."""
    return "".join(alter_sql(schema, c.table, c.was if back else c.during) for c in changes)


_CURRENT_SQL = """
SELECT c.relname::text, c.relreplident::text,
       (SELECT ic.relname::text FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
        WHERE i.indrelid = c.oid AND i.indisreplident LIMIT 1)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')
"""


def current(conn: psycopg.Connection[Any], schema: str, tables: Sequence[str]) -> dict[str, Identity]:
    """The replica identity of each of these tables as it stands (a table that is gone is left out)."""
    return {r[0]: Identity(r[1], r[2] if r[1] == "i" else None) for r in conn.execute(_CURRENT_SQL, (schema, list(tables)))}


def put(conn: psycopg.Connection[Any], database: str, schema: str, changes: Sequence[Change], *, back: bool, hint: str,
        wait: float | None = None) -> list[Change]:
    """Each table's identity to the move's (back: to what it was) where it is not that already, each ALTER with
    lock retries (with_lock_retries; conn autocommit); the tables changed. A table that is gone is passed over."""
    stands = current(conn, schema, [c.table for c in changes])
    done: list[Change] = []
    for c in changes:
        want = c.was if back else c.during
        if c.table not in stands or stands[c.table] == want:
            continue
        with_lock_retries(conn, alter_sql(schema, c.table, want), database=database, table=f"{schema}.{c.table}", hint=hint,
                          what="set its replica identity", wait=LOCK_WAIT_S if wait is None else wait)
        done.append(c)
    return done


def with_lock_retries(conn: psycopg.Connection[Any], statement: str, *, database: str, table: str, what: str, hint: str,
                      wait: float = LOCK_WAIT_S) -> int:
    """statement (one that locks table) in a transaction of its own whose lock waits at most LOCK_TRY_MS; tried
    again after a sleep that doubles from FIRST_SLEEP_S to LAST_SLEEP_S, each with +-50% jitter (movers that
    retry in step would collide again), until wait seconds have passed. The tries it took; then a ConflictError
    naming who held the lock."""
    start = time.monotonic()
    nap = FIRST_SLEEP_S
    tries = 0
    while True:
        tries += 1
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TRY_MS}ms'")
                conn.execute(statement)
            return tries
        except psycopg.errors.LockNotAvailable:
            pass
        pause = nap * random.uniform(0.5, 1.5)
        if time.monotonic() - start + pause > wait:
            break
        time.sleep(pause)
        nap = min(nap * 2, LAST_SLEEP_S)
    raise ConflictError(f"could not lock table {table} to {what} within {wait:g} s ({tries} tries of {LOCK_TRY_MS} ms each):"
                        f" {holders(conn, table)}", where=database, hint=hint)


_HOLDERS_SQL = """
SELECT l.pid, coalesce(nullif(a.application_name, ''), a.usename::text, '?'), coalesce(a.state, '?'),
       pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now() - coalesce(a.xact_start, a.query_start)))::int,
       pg_catalog.left(pg_catalog.regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 60)
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = pg_catalog.to_regclass(%s) AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
ORDER BY a.xact_start NULLS LAST LIMIT 3
"""


def holders(conn: psycopg.Connection[Any], table: str) -> str:
    """Who holds a lock on table now, for the message: 'pid 123 (psql, idle in transaction for 75 s: UPDATE ...)'."""
    schema, _, name = table.partition(".")
    rows = conn.execute(_HOLDERS_SQL, (ident(schema, name),)).fetchall()
    if not rows:
        return "its holders had let go by the last try"
    return "held by " + ", ".join(f"pid {pid} ({app}, {state} for {secs} s: {query})" for pid, app, state, secs, query in rows)


def keyless_tables(conn: psycopg.Connection[Any], schemas: Sequence[str]) -> list[tuple[str, str, Identity | None, tuple[str, ...], Identity]]:
    """Of the schemas' tables, those whose identity would not do for an online move: (schema, table, the identity
    the move gives it or None when none would, the columns without equality, its identity as it stands). For
    `pgidgen check`: one query (and the equality probes of the columns' types, once per type)."""
    out = []
    verdict: dict[str, bool] = {}
    for schema, table, replident, index, pk, unique in conn.execute(
            "SELECT n.nspname::text, c.relname::text, c.relreplident::text," + IDENTITY_COLUMNS_SQL +
            " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ANY(%s) AND c.relkind = 'r' AND c.relpersistence = 'p' ORDER BY 1, 2", (list(schemas),)).fetchall():
        keys = keys_of(replident, index, pk, unique)
        unequal = unequal_columns(conn, schema, table, verdict) if keys.full_decides else ()
        during = for_move(keys, unequal)
        if during is not None or not movable(keys, unequal):
            out.append((schema, table, during, unequal, keys.identity))
    return out
