"""Where a move's SQL is rendered: every statement the mover runs comes from here, as literal text.

The executor (engine.py) runs exactly these strings and `--dry-run` prints them, so what a DBA reads is what
runs. Values known only at run time (the source's last ID, the measured clock skew) are parameters of the
render functions; the dry run renders them as named placeholders.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from ..idgen import CLAIM_LOCK_BASE, LOCK_CLASS
from ..redact import scrub


def ident(*parts: str) -> str:
    return sql.Identifier(*parts).as_string(None)


def literal(value: object) -> str:
    return sql.Literal(value).as_string(None)


@dataclass(frozen=True)
class TableRef:
    schema: str
    name: str

    def q(self, schema: str | None = None) -> str:
        return ident(schema or self.schema, self.name)


@dataclass
class Names:
    """The replication objects of one move, all derived from its token so resume/rollback can find them."""

    token: str

    @property
    def publication(self) -> str:
        return f"pgidgen_move_{self.token}"

    @property
    def slot(self) -> str:
        return f"pgidgen_move_{self.token}"

    @property
    def subscription(self) -> str:
        return f"pgidgen_move_{self.token}"


# -- target preparation --------------------------------------------------------------------------------


def target_row_sql(shard: int, schema: str, *, reset_offset: bool = True) -> str:
    """The target's catalog row while it fills: 'incoming' is served by nobody (see the shard-map contract).
    A schema-only copy has a fresh offset sequence, which next_id() and last_id() need to read 0, not NULL."""
    text = f"INSERT INTO pgidgen.shards (shard, schema_name, state) VALUES ({shard}, {literal(schema)}, 'incoming');\n"
    if reset_offset:
        text += f"SELECT pg_catalog.setval({literal(ident(schema) + '.pgidgen_offset')}, 0, true);\n"
    return text


def shard_set(shards: int | Sequence[int]) -> str:
    """A shard number or a batch's, as SQL: `= 5`, `IN (5, 6, 9)`."""
    items = [shards] if isinstance(shards, int) else sorted(shards)
    return f"= {items[0]}" if len(items) == 1 else f"IN ({', '.join(str(int(s)) for s in items)})"


def source_moving_sql(shards: int | Sequence[int]) -> str:
    return f"UPDATE pgidgen.shards SET state = 'moving', updated_at = now() WHERE shard {shard_set(shards)} AND state = 'active';\n"


# -- replication ---------------------------------------------------------------------------------------


def publication_sql(names: Names, tables: Sequence[TableRef]) -> str:
    members = [t.q() for t in tables]
    members.append(f"pgidgen.move_heartbeat WHERE (token = {literal(names.token)})")
    return f"CREATE PUBLICATION {ident(names.publication)} FOR TABLE {', '.join(members)};\n"


def slot_sql(names: Names, *, failover: bool = False) -> str:
    """A replication command (sent on a replication=database connection): the slot, and a snapshot of the
    moment from which it streams, which pg_dump --snapshot copies the rows at. failover (PostgreSQL 17+): a
    failover slot, which a standby synchronizing slots keeps through a failover."""
    return f"CREATE_REPLICATION_SLOT {ident(names.slot)} LOGICAL pgoutput (SNAPSHOT 'export'{', FAILOVER true' if failover else ''})"


def subscription_sql(names: Names, source_conninfo: str, *, show: bool = False) -> str:
    conninfo = scrub(source_conninfo) if show else source_conninfo
    return (
        f"CREATE SUBSCRIPTION {ident(names.subscription)} CONNECTION {literal(conninfo)}\n"
        f"    PUBLICATION {ident(names.publication)}\n"
        f"    WITH (create_slot = false, slot_name = {literal(names.slot)}, copy_data = false, enabled = true);\n"
    )


def heartbeat_sql(token: str, beat: int) -> str:
    return f"INSERT INTO pgidgen.move_heartbeat (token, beat) VALUES ({literal(token)}, {beat});\n"


#: The source side of a text-format row stream prints values the way pg_dump does, so any target reads them back.
COPY_OUT_SETTINGS = ["SET DateStyle = 'ISO'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3",
                     "SET statement_timeout = 0", "SET idle_in_transaction_session_timeout = 0"]


def _column_list(columns: Sequence[str]) -> str:
    return f" ({', '.join(ident(c) for c in columns)})" if columns else ""


def copy_out_sql(schema: str, table: str, *, binary: bool, columns: Sequence[str] = ()) -> str:
    """One table's rows at the copy's snapshot (the stream's transaction imported it). Both sides name the
    columns (the source's, in its order), as pg_dump does: a table's column order can differ between the two
    (pg_dump recreates a child table with its parents' columns first), and COPY without a list goes by position."""
    return f"COPY {ident(schema, table)}{_column_list(columns)} TO STDOUT" + (" (FORMAT binary)" if binary else "")


def copy_in_sql(schema: str, table: str, *, binary: bool, freeze: bool, columns: Sequence[str] = ()) -> str:
    """FREEZE: the table was created in the same transaction, so its rows are written frozen and hinted."""
    opts = ["FORMAT binary"] if binary else []
    if freeze:
        opts.append("FREEZE")
    return f"COPY {ident(schema, table)}{_column_list(columns)} FROM STDIN" + (f" ({', '.join(opts)})" if opts else "")


# -- cutover -------------------------------------------------------------------------------------------


#: The partitioned tables of a set of schemas (schema, table): the freeze locks them and the retired copy guards
#: them with their partitions. Read from pg_partitioned_table, which holds only those: pg_class has no index by
#: schema, and a query per shard that scans it made a batch's cost grow with every shard of the database.
PARTITIONED_SQL = (
    "SELECT n.nspname, c.relname FROM pg_catalog.pg_partitioned_table pt JOIN pg_catalog.pg_class c ON c.oid = pt.partrelid"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s) ORDER BY 1, 2"
)

def partitioned_of(conn: Any, schemas: Sequence[str]) -> dict[str, list[str]]:
    """Per schema, its partitioned tables (none: an empty list), in one query."""
    out: dict[str, list[str]] = {s: [] for s in schemas}
    for schema, name in conn.execute(PARTITIONED_SQL, (list(schemas),)):
        out.setdefault(str(schema), []).append(str(name))
    return out


#: The relations of the schemas n, found through pg_depend's index (each has a dependency on its schema: pg_class
#: has no index on relnamespace, and a join on it reads all of pg_class, which grows with the shards).
RELATIONS_OF = ("pg_catalog.pg_namespace n JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass"
                " AND d.refobjid = n.oid AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass"
                " JOIN pg_catalog.pg_class c ON c.oid = d.objid AND c.relnamespace = n.oid")

#: Per table of a schema: its columns (by name) and whether a publication holds it (engine._changed_tables).
TABLES_AS_THEY_STAND_SQL = """
SELECT c.relname,
       (SELECT pg_catalog.string_agg(a.attname OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attname)
        FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       c.relpersistence <> 'p'  -- unlogged: not published, copied in the pause (unlogged.py)
       OR EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
                  WHERE pr.prrelid = c.oid AND p.pubname = %(publication)s)
FROM {rels}
WHERE n.nspname = %(schema)s AND c.relkind = 'r'
""".replace("{rels}", RELATIONS_OF)


#: TABLES_AS_THEY_STAND_SQL for a batch's schemas at once (one query inside the pause), the schema first.
TABLES_AS_THEY_STAND_MANY_SQL = TABLES_AS_THEY_STAND_SQL.replace("SELECT c.relname,", "SELECT n.nspname, c.relname,", 1).replace(
    "n.nspname = %(schema)s", "n.nspname = ANY(%(schemas)s)")


def freeze_sql(shards: int | Sequence[int], tables: Sequence[TableRef], lock_timeout_ms: int) -> str:
    """Stop writes to the shard on the source. First the shard's claim lock exclusively, which routed writes
    hold shared from pgidgen.claim_shard() until they end, and its catalog row FOR UPDATE, which claims under
    REPEATABLE READ also hold FOR SHARE (both in the order routed transactions take them, so no deadlock):
    claimed transactions finish, new ones wait, and read the row again once the flip committed. Then EXCLUSIVE
    on the tables (partitioned parents included: a write routed through one locks the parent first) for
    writers that do not claim: it blocks INSERT/UPDATE/DELETE/SELECT FOR UPDATE and TRUNCATE, and lets plain
    reads go on. The waits together stay within lock_timeout_ms. A batch locks its shards in shard order (a
    routed transaction claims one)."""
    budget = max(1, int(lock_timeout_ms))
    text = f"SET LOCAL lock_timeout = '{budget}ms';\n"
    ordered = [shards] if isinstance(shards, int) else sorted(shards)
    text += (f"SELECT pg_catalog.pg_advisory_xact_lock({LOCK_CLASS}, {CLAIM_LOCK_BASE} - s)"
             f" FROM pg_catalog.unnest('{{{','.join(map(str, ordered))}}}'::pg_catalog.int4[]) AS s;\n")
    order = "" if len(ordered) == 1 else " ORDER BY shard"
    text += f"SELECT 1 FROM pgidgen.shards WHERE shard {shard_set(shards)}{order} FOR UPDATE;\n"
    if tables:
        # what is left of the budget for the tables (the script's statements share one statement_timestamp)
        text += (f"SELECT pg_catalog.set_config('lock_timeout', GREATEST(1, {budget} - pg_catalog.floor(pg_catalog.date_part('epoch',"
                 " pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp()) * 1000))::pg_catalog.int8::pg_catalog.text || 'ms', true);\n")
        text += f"LOCK TABLE {', '.join('ONLY ' + t.q() for t in tables)} IN EXCLUSIVE MODE;\n"
    return text


#: The pause's guard: the source's frozen transaction, idle while pgidgen waits on the target, ends by itself (its
#: locks with it) when pgidgen goes silent for this many times --max-pause, at least PAUSE_IDLE_FLOOR_S: a link
#: that stalls in the pause (nothing forwarded, nothing closed) would otherwise hold the application's writes for
#: as long as the stall. pgidgen then finds its session gone and runs the cutover again (steps/ride.py).
PAUSE_IDLE_FACTOR = 5
PAUSE_IDLE_FLOOR_S = 10.0


def pause_guard_sql(max_pause: float) -> str:
    ms = int(max(PAUSE_IDLE_FLOOR_S, PAUSE_IDLE_FACTOR * max_pause) * 1000)
    return f"SET LOCAL idle_in_transaction_session_timeout = '{ms}ms';\n"


@dataclass(frozen=True)
class Retiring:
    """One shard of a cutover's retire: its schema, the name its copy takes, and the tables guarded."""

    shard: int
    schema: str
    retired: str
    tables: Sequence[TableRef]


def retire_sql(shard: int, schema: str, retired: str, tables: Sequence[TableRef], target: str) -> str:
    """One shard's retire as the dry run prints it: the pause's part, then the guards made after it."""
    one = [Retiring(shard, schema, retired, tables)]
    return retire_many_sql(one) + "-- after the flip, while the target activates:\n" + guard_sql(one, target)


def retire_many_sql(shards: Sequence[Retiring]) -> str:
    """The pause's part of the retire: rename each source copy (late writers by name get 'does not exist'; the
    rename resets every session's cached plans, so a prepared write looks its table up again and fails alike),
    then the batch's catalog rows in one UPDATE: the catalog's statement triggers (map_changed, claim_fence) fire
    once for the batch, not once a shard (0.15-0.2 ms each). Routed writers wait on the claim locks the freeze
    holds and find the shards retired. The write guards come after the flip (guard_sql)."""
    lines = [f"ALTER SCHEMA {ident(r.schema)} RENAME TO {ident(r.retired)};" for r in shards]
    if len(shards) == 1:
        r = shards[0]
        lines.append(f"UPDATE pgidgen.shards SET state = 'retired', schema_name = {literal(r.retired)}, updated_at = now() WHERE shard = {r.shard};")
    elif shards:
        values = ", ".join(f"({r.shard}, {literal(r.retired)})" for r in sorted(shards, key=lambda r: r.shard))
        lines.append(f"UPDATE pgidgen.shards s SET state = 'retired', schema_name = v.retired, updated_at = now()"
                     f" FROM (VALUES {values}) AS v(shard, retired) WHERE s.shard = v.shard;")
    return "\n".join(lines) + "\n"


def guard_sql(shards: Sequence[Retiring], target: str) -> str:
    """The retired copies' write guards, an always-on trigger on each table (partitioned parents too, as a statement
    trigger on a partition does not fire for rows routed through its parent): a write that still reaches a copy
    (by its new name, from a replication apply worker that maps tables by oid, or in replica mode) fails loudly.
    Made after the flip, beside activate, not in the pause (two DDL statements a table: 1 ms a shard of it);
    CREATE OR REPLACE, so a resumed move makes them again."""
    lines: list[str] = []
    for r in shards:
        for t in r.tables:
            q = ident(r.retired, t.name)
            lines.append(
                f"CREATE OR REPLACE TRIGGER pgidgen_retired BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {q}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.refuse_write({literal(str(r.shard))}, {literal(target)});"
            )
            lines.append(f"ALTER TABLE {q} ENABLE ALWAYS TRIGGER pgidgen_retired;")
    return "\n".join(lines) + "\n"


def unretire_sql(shard: int, schema: str, retired: str, tables: Sequence[str]) -> str:
    """The rollback of retire_sql, for a move interrupted between the source flip and the target flip."""
    lines = [f"DROP TRIGGER IF EXISTS pgidgen_retired ON {ident(retired, t)};" for t in tables]
    lines.append(f"ALTER SCHEMA {ident(retired)} RENAME TO {ident(schema)};")
    lines.append(f"UPDATE pgidgen.shards SET state = 'active', schema_name = {literal(schema)}, updated_at = now() WHERE shard = {shard};")
    return "\n".join(lines) + "\n"


#: The sequences of a shard's ID generator (the rest of a schema's sequences are its tables' own).
GENERATOR_SEQUENCES = ("pgidgen_counter", "pgidgen_offset")

_ON_SCHEMA = ("JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND d.refobjid = n.oid"
              " AND d.refobjsubid = 0 AND d.deptype = 'n' AND d.classid = 'pg_catalog.{catalog}'::pg_catalog.regclass")


def on_schema(catalog: str) -> str:
    """`JOIN pg_depend d`: the objects of one catalog (d.objid) that depend on schema n, by pg_depend's index."""
    return _ON_SCHEMA.format(catalog=catalog)


def relations_of(schemas: str, select: str) -> str:
    """`SELECT select` over every relation (pg_class c) of the schemas (n: a CTE or parenthesised query with their
    oid), found through pg_depend's index on the referenced object instead of a pass over pg_class, which has no
    index on the schema (22 ms at 8192 shards, in every query of a batch's checks). Each relation depends on its
    schema but an index (found through pg_index, its table's), a composite type's (its type does) and a TOAST
    table (in pg_toast). tests/test_move_schemacache.py holds it to a pass over pg_class."""
    return "\n  UNION ALL ".join((
        f"SELECT {select} FROM {schemas} n {_ON_SCHEMA.format(catalog='pg_class')} JOIN pg_catalog.pg_class c ON c.oid = d.objid",
        f"SELECT {select} FROM {schemas} n {_ON_SCHEMA.format(catalog='pg_class')}"
        " JOIN pg_catalog.pg_index i ON i.indrelid = d.objid JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid",
        f"SELECT {select} FROM {schemas} n {_ON_SCHEMA.format(catalog='pg_type')}"
        " JOIN pg_catalog.pg_type t ON t.oid = d.objid AND t.typtype = 'c' JOIN pg_catalog.pg_class c ON c.oid = t.typrelid",
    ))


#: The sequences of the schemas named (ANY(%s)), as (schema, name, pg_sequence_last_value: NULL for one not yet
#: called), through pg_depend's index: one plan for every sequence of a batch (steps/activate.py).
SEQUENCE_VALUES_SQL = ("SELECT n.nspname, c.relname, pg_catalog.pg_sequence_last_value(c.oid) FROM pg_catalog.pg_namespace n "
                       + _ON_SCHEMA.format(catalog="pg_class")
                       + " JOIN pg_catalog.pg_class c ON c.oid = d.objid AND c.relkind = 'S' WHERE n.nspname = ANY(%s) ORDER BY 1, 2")


@dataclass
class SeqValue:
    name: str
    last_value: int
    is_called: bool


def activate_sql(
    shard: int,
    schema: str,
    *,
    last_id: int | str,
    ahead_ms: int | str,
    sequences: Sequence[SeqValue] = (),
    subscription: str | None = None,
) -> str:
    return activate_many_sql([Activating(shard, schema, last_id, sequences)], ahead_ms=ahead_ms, subscription=subscription)


@dataclass(frozen=True)
class Activating:
    """One shard of activate: the last ID its source handed out, and its own sequences as they stood."""

    shard: int
    schema: str
    last_id: int | str
    sequences: Sequence[SeqValue] = ()


def activate_many_sql(shards: Sequence[Activating], *, ahead_ms: int | str, subscription: str | None = None) -> str:
    """On the target, one transaction: carry user sequences, move each generator past everything the source issued
    (and past the source's clock at the flip, estimated from the target's clock plus the measured skew), go active
    (the batch's catalog rows in one UPDATE: the catalog's statement triggers fire once), stop applying."""
    values = [(ident(a.schema, s.name), s.last_value, s.is_called) for a in shards for s in a.sequences]
    if len(shards) == 1:
        lines = [f"SELECT pg_catalog.setval({literal(name)}, {last}, {str(called).lower()});" for name, last, called in values]
    else:  # one statement for the batch's sequences (a statement each was some 0.1 ms a shard of the pause)
        rows = ", ".join(f"({literal(name)}, ({last})::pg_catalog.int8, {str(called).lower()})" for name, last, called in values)
        lines = [f"SELECT pg_catalog.setval(v.seq::pg_catalog.regclass, v.last_value, v.is_called) FROM (VALUES {rows}) AS v(seq, last_value, is_called);"] if values else []
    ahead = f"pgidgen.max_id(clock_timestamp() + interval '{ahead_ms} milliseconds')"
    if len(shards) == 1:
        a = shards[0]
        lines.append(f"SELECT pgidgen.advance_generator({a.shard}, greatest({a.last_id}::bigint, {ahead}));")
        lines.append(f"UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = {a.shard} AND state = 'incoming';")
    elif shards:
        ordered = sorted(shards, key=lambda a: a.shard)
        shard_array = f"'{{{','.join(str(a.shard) for a in ordered)}}}'::pg_catalog.int4[]"
        lines.append(f"SELECT pgidgen.advance_generators({shard_array}, ARRAY[{', '.join(f'greatest({a.last_id}::bigint, {ahead})' for a in ordered)}]);")
        lines.append(f"UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = ANY({shard_array}) AND state = 'incoming';")
    if subscription:
        lines.append(f"ALTER SUBSCRIPTION {ident(subscription)} DISABLE;")
    return "\n".join(lines) + "\n"


# -- teardown ------------------------------------------------------------------------------------------


def drop_subscription_sql(subscription: str) -> str:
    """Detach the slot first so DROP SUBSCRIPTION never needs the source (the mover drops the slot itself)."""
    q = ident(subscription)
    return f"ALTER SUBSCRIPTION {q} DISABLE;\nALTER SUBSCRIPTION {q} SET (slot_name = NONE);\nDROP SUBSCRIPTION {q};\n"


def drop_slots_sql(names: Names, subscription_oid: int | None) -> str:
    cond = f"slot_name = {literal(names.slot)}"
    if subscription_oid:
        cond += f" OR slot_name LIKE {literal(f'pg_{subscription_oid}_sync_%')}"
    return f"SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE ({cond}) AND NOT active;\n"


def drop_publication_sql(names: Names) -> str:
    return (
        f"DROP PUBLICATION IF EXISTS {ident(names.publication)};\n"
        f"DELETE FROM pgidgen.move_heartbeat WHERE token = {literal(names.token)};\n"
    )


# -- verification --------------------------------------------------------------------------------------

#: Row text depends on these settings; both sides use the same ones so equal rows hash equally.
VERIFY_SETTINGS = (
    "SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; SET TimeZone = 'UTC';"
    " SET extra_float_digits = 3; SET bytea_output = 'hex';"
)


@dataclass(frozen=True)
class ColumnHash:
    """A column and its type's 64-bit hash function (the default hash opclass's extended support function)."""

    name: str
    function: tuple[str, str] | None  # (schema, name); None: the type has none of its own (e.g. an array)
    as_text: bool = False  # hashed as its text: see COLUMN_HASHES_SQL
    halves: bool = False  # a bigint: its high half hashed too (see _column_hash)


def checksum_sql(schema: str, table: str, columns: Sequence[ColumnHash] | None = None, *, as_text: bool = False) -> str:
    """Row count and the sum of 64-bit hashes of every row: order-independent, one sequential scan, so it needs
    no sort and parallelises across the two servers. With columns, a row's hash is the XOR of each column's own
    hash function seeded with its position (a bigint's high half too), cheaper than hash_record_extended on the whole row, which is
    what columns without a hash function of their own take (inside ROW(...)), and what runs without columns. A
    NULL hashes to minus its position: some hash functions return their seed for a value (0.0 for floats), so
    the position itself would let a NULL that became such a value pass. Tables with a column type that has no
    hash at all (json, xml, point, ...) hash each column's text instead (as_text; by name, so the columns' order
    in the table does not matter), the same choice on both sides (see verify.compare); without columns, the
    row's text.
    (Chaining the columns, each column's hash seeding the next, is one call per column cheaper but unsound:
    hash functions that ignore their seed for some values, an empty array's or a NULL inside a record, reset
    the chain, and those that return it, 0.0's, drop a column's position.)"""
    if as_text and columns:  # each column's text, by name: independent of the columns' order in either table
        h = " # ".join(f"coalesce({_column_hash(ColumnHash(c.name, None, True), k)}, -{k})" for k, c in enumerate(columns, start=1))
    elif as_text:
        h = "pg_catalog.hashtextextended(ROW(r.*)::text, 0)"
    elif columns is None:
        h = "pg_catalog.hash_record_extended(ROW(r.*), 0)"
    elif not columns:
        h = "0::bigint"
    else:
        h = " # ".join(f"coalesce({_column_hash(c, k)}, -{k})" for k, c in enumerate(columns, start=1))
    return f"SELECT count(*), coalesce(sum({h}), 0)::text FROM ONLY {ident(schema, table)} AS r"


def _column_hash(c: ColumnHash, seed: int) -> str:
    """The column's 64-bit hash with the given seed: NULL for NULL (every hash function is strict), except for
    types without a hash function of their own, hashed as a one-column record."""
    col = "r." + ident(c.name)
    if c.as_text:
        return f'pg_catalog.hashtextextended({col}::text COLLATE "C", {seed})'
    if c.function and c.halves:
        # hashint8extended hashes the XOR of a bigint's two halves: 1 and 2^32 alike, and a value with its halves
        # swapped. The high half hashed on its own (seeded apart) makes the pair a function of the whole value.
        return f"({ident(*c.function)}({col}, {seed}) OPERATOR(pg_catalog.#) {ident(*c.function)}({col} OPERATOR(pg_catalog.>>) 32, {-seed}))"
    if c.function:
        return f"{ident(*c.function)}({col}, {seed})"
    return f"pg_catalog.hash_record_extended(ROW({col}), {seed})"


#: Per column, the type's (or a domain's base type's) default hash opclass and its extended hash function; whether
#: to hash the column's text instead (as_text), for the types whose hash is not a function of the value as
#: stored; and whether it is a bigint (halves, see _column_hash). Text for: types defined in the database (an
#: enum hashes its OID, which differs between two databases); collatable ones (a nondeterministic collation
#: hashes 'A' and 'a' alike; the text is hashed under "C"); those whose equality is looser than identity
#: (numeric 1.5 = 1.50, float -0 = 0, interval '1 day' = '24 hours', jsonb, whose hash also returns the seed for
#: '{}' and '[]'); those hashed by hashint8extended, which folds the two 32-bit halves into one before hashing
#: (timestamps, times, pg_lsn, xid8: 1 and 2^32 microseconds after midnight hash alike); money, which has no hash
#: function; arrays of all these and
#: of bigint; ranges and multiranges. Their text is exact under VERIFY_SETTINGS.
COLUMN_HASHES_SQL = """
SELECT c.relname, a.attname, fn.nspname, fn.proname,
       bt.oid::bigint >= 16384 OR a.attcollation <> 0 OR bt.typelem = 'pg_catalog.int8'::pg_catalog.regtype
       OR EXISTS (SELECT FROM pg_catalog.pg_type x WHERE x.oid IN (bt.oid, bt.typelem) AND (x.typtype IN ('r', 'm') OR x.oid = ANY (ARRAY[
           'pg_catalog.float4', 'pg_catalog.float8', 'pg_catalog.numeric', 'pg_catalog.interval', 'pg_catalog.jsonb',
           'pg_catalog.timestamp', 'pg_catalog.timestamptz', 'pg_catalog.time', 'pg_catalog.timetz', 'pg_catalog.pg_lsn',
           'pg_catalog.xid8', 'pg_catalog.money']::pg_catalog.regtype[]))) AS as_text,
       bt.oid = 'pg_catalog.int8'::pg_catalog.regtype AS halves
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
JOIN pg_catalog.pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN LATERAL (
    SELECT pn.nspname, p.proname
    FROM pg_catalog.pg_opclass oc
    JOIN pg_catalog.pg_am am ON am.oid = oc.opcmethod AND am.amname = 'hash'
    JOIN pg_catalog.pg_amproc ap ON ap.amprocfamily = oc.opcfamily AND ap.amprocnum = 2
         AND ap.amproclefttype = oc.opcintype AND ap.amprocrighttype = oc.opcintype
    JOIN pg_catalog.pg_proc p ON p.oid = ap.amproc AND p.proargtypes[0] = oc.opcintype
    JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace
    WHERE oc.opcdefault AND oc.opcintype = bt.oid
    LIMIT 1
) fn ON true
WHERE n.nspname = %s AND c.relkind = 'r'
ORDER BY c.relname, a.attnum
"""


@dataclass
class PlannedStep:
    """One step of a move as the dry run shows it."""

    name: str
    database: str
    what: str
    sql: str = ""
    locks: list[str] = field(default_factory=list)
