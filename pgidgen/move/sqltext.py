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


#: The schema of a pg_depend dependent (classid, objid, objsubid): its own, or, for objects without one (column
#: defaults, rules, triggers, policies), their table's.
_OWNER_SCHEMA = """coalesce((pg_catalog.pg_identify_object(classid, objid, objsubid)).schema, (
        SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = CASE classid
            WHEN 'pg_catalog.pg_attrdef'::pg_catalog.regclass THEN (SELECT adrelid FROM pg_catalog.pg_attrdef WHERE oid = objid)
            WHEN 'pg_catalog.pg_rewrite'::pg_catalog.regclass THEN (SELECT ev_class FROM pg_catalog.pg_rewrite WHERE oid = objid)
            WHEN 'pg_catalog.pg_trigger'::pg_catalog.regclass THEN (SELECT tgrelid FROM pg_catalog.pg_trigger WHERE oid = objid)
            WHEN 'pg_catalog.pg_policy'::pg_catalog.regclass THEN (SELECT polrelid FROM pg_catalog.pg_policy WHERE oid = objid)
        END), (  -- an operator class's member function or operator: its family's schema
        SELECT n.nspname FROM pg_catalog.pg_opfamily f JOIN pg_catalog.pg_namespace n ON n.oid = f.opfnamespace
        WHERE f.oid = CASE classid
            WHEN 'pg_catalog.pg_amproc'::pg_catalog.regclass THEN (SELECT amprocfamily FROM pg_catalog.pg_amproc WHERE oid = objid)
            WHEN 'pg_catalog.pg_amop'::pg_catalog.regclass THEN (SELECT amopfamily FROM pg_catalog.pg_amop WHERE oid = objid)
        END), (  -- a cast (no schema of its own): its function's, else its target type's, else its source type's (casts.py)
        SELECT coalesce(nullif(fn.nspname, 'pg_catalog'), nullif(tn.nspname, 'pg_catalog'), sn.nspname)
        FROM pg_catalog.pg_cast k
        JOIN pg_catalog.pg_type s ON s.oid = k.castsource JOIN pg_catalog.pg_namespace sn ON sn.oid = s.typnamespace
        JOIN pg_catalog.pg_type t ON t.oid = k.casttarget JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
        LEFT JOIN pg_catalog.pg_proc f ON f.oid = k.castfunc LEFT JOIN pg_catalog.pg_namespace fn ON fn.oid = f.pronamespace
        WHERE classid = 'pg_catalog.pg_cast'::pg_catalog.regclass AND k.oid = objid))"""


def _objects_sql(schema_param: str) -> str:
    """The relations, types and functions of the schema named by schema_param, as (catalog, oid): none of the
    three catalogs has an index on the schema, so this reads each of them whole."""
    return f"""
    SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, oid FROM pg_catalog.pg_proc WHERE pronamespace = pg_catalog.to_regnamespace({schema_param})
    UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, oid FROM pg_catalog.pg_type WHERE typnamespace = pg_catalog.to_regnamespace({schema_param})
    UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, oid FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.to_regnamespace({schema_param})"""


def _dependents_sql(schema_param: str, select: str, *, objects: str | None = None) -> str:
    """Over the dependents (pg_depend: column defaults, constraints, types, views, triggers, policies; not function
    bodies) of the relations, types and functions of the schema named by schema_param (or of the objects the
    query `objects` returns, as (catalog, oid)), each with its schema."""
    return f"""
WITH ref (c, o) AS ({objects or _objects_sql(schema_param)}),
dependent (classid, objid, objsubid) AS (
    SELECT DISTINCT d.classid, d.objid, d.objsubid FROM pg_catalog.pg_depend d JOIN ref ON d.refclassid = ref.c AND d.refobjid = ref.o
    WHERE d.deptype IN ('n', 'a')),
owner (classid, objid, objsubid, schema) AS (
    SELECT classid, objid, objsubid, {_OWNER_SCHEMA} FROM dependent)
{select}
"""


#: Does any object of the shard's schema depend on an object of the pgidgen schema?
DEPENDS_ON_CATALOG_SQL = _dependents_sql("'pgidgen'", "SELECT EXISTS (SELECT FROM owner WHERE schema = %(schema)s)")
#: The same for a batch's schemas at once.
DEPENDS_ON_CATALOG_ANY_SQL = _dependents_sql("'pgidgen'", "SELECT EXISTS (SELECT FROM owner WHERE schema = ANY(%(schemas)s))")

#: Objects outside a shard's schema that depend on it (a view over its tables, a foreign key or a column default
#: elsewhere): they cannot follow the shard to another database, and DROP SCHEMA ... CASCADE would drop them.
#: Membership of publications is not such an object.
_OUTSIDE = """SELECT DISTINCT (x).type || ' ' || (x).identity FROM (
    SELECT pg_catalog.pg_identify_object(CASE WHEN r.rulename = '_RETURN' THEN 'pg_catalog.pg_class'::pg_catalog.regclass ELSE o.classid END,
                                         coalesce(CASE WHEN r.rulename = '_RETURN' THEN r.ev_class END, o.objid),
                                         CASE WHEN r.rulename = '_RETURN' THEN 0 ELSE o.objsubid END) AS x  -- a view, rather than its rule
    FROM owner o LEFT JOIN pg_catalog.pg_rewrite r ON o.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND r.oid = o.objid
    WHERE o.schema IS DISTINCT FROM %(schema)s
      AND o.classid NOT IN ('pg_catalog.pg_publication_rel'::pg_catalog.regclass, pg_catalog.to_regclass('pg_catalog.pg_publication_namespace'))) d
ORDER BY 1"""
OUTSIDE_DEPENDENTS_SQL = _dependents_sql("%(schema)s", _OUTSIDE)


#: The objects of each retired copy of a database (its relations, types and functions: _objects_sql), read in
#: one pass over the catalogs, by shard and schema: cleanup's OUTSIDE_DEPENDENTS_OF_SQL of each copy takes them.
RETIRED_OBJECTS_SQL = """
WITH n AS (SELECT s.shard, s.schema_name, ns.oid FROM pgidgen.shards s JOIN pg_catalog.pg_namespace ns ON ns.nspname = s.schema_name
           WHERE s.state = 'retired')
SELECT n.shard, n.schema_name, 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid, p.oid FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid
UNION ALL SELECT n.shard, n.schema_name, 'pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid, t.oid FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid
UNION ALL SELECT n.shard, n.schema_name, 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, c.oid FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid
"""

#: OUTSIDE_DEPENDENTS_SQL of a schema whose objects are known (RETIRED_OBJECTS_SQL): pg_depend's index alone, no
#: pass over pg_class, pg_type and pg_proc (which made a cleanup of N copies read those catalogs N times).
OUTSIDE_DEPENDENTS_OF_SQL = _dependents_sql("%(schema)s", _OUTSIDE, objects="SELECT * FROM ROWS FROM (pg_catalog.unnest(%(classes)s::pg_catalog.oid[]), pg_catalog.unnest(%(oids)s::pg_catalog.oid[]))")

#: OUTSIDE_DEPENDENTS_SQL for a batch's schemas at once: what depends on any of them from outside all of them.
OUTSIDE_DEPENDENTS_ANY_SQL = OUTSIDE_DEPENDENTS_SQL.replace(
    "= pg_catalog.to_regnamespace(%(schema)s)",
    "IN (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = ANY(%(schemas)s))",
).replace("WHERE o.schema IS DISTINCT FROM %(schema)s", "WHERE coalesce(o.schema <> ALL(%(schemas)s), true)")
assert "%(schema)s" not in OUTSIDE_DEPENDENTS_ANY_SQL

#: Objects outside the shard's schema (and outside pg_catalog, information_schema and pgidgen, which init
#: installs) that the shard's objects depend on: a foreign key's table, a column's type, a default's function, a
#: view's table; as addresses (pg_identify_object_as_address) that the target can look up; with the extension
#: each belongs to (an array type by its element's) and that extension's schema, or NULLs.
EXTERNAL_REFERENCES_SQL = """
WITH n AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),
d (classid, objid) AS (
    SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, co.oid FROM pg_catalog.pg_constraint co JOIN n ON co.connamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass, ad.oid FROM pg_catalog.pg_attrdef ad
              JOIN pg_catalog.pg_class c ON c.oid = ad.adrelid JOIN n ON c.relnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass, r.oid FROM pg_catalog.pg_rewrite r
              JOIN pg_catalog.pg_class c ON c.oid = r.ev_class JOIN n ON c.relnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass, tg.oid FROM pg_catalog.pg_trigger tg
              JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid JOIN n ON c.relnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass, po.oid FROM pg_catalog.pg_policy po
              JOIN pg_catalog.pg_class c ON c.oid = po.polrelid JOIN n ON c.relnamespace = n.oid),
r AS (SELECT DISTINCT dep.refclassid, dep.refobjid FROM pg_catalog.pg_depend dep JOIN d ON dep.classid = d.classid AND dep.objid = d.objid
      WHERE dep.deptype = 'n')
SELECT a.type, a.object_names, a.object_args, i.type || ' ' || i.identity, ext.extname, ext.nspname
FROM r CROSS JOIN pg_catalog.pg_identify_object(r.refclassid, r.refobjid, 0) i
CROSS JOIN pg_catalog.pg_identify_object_as_address(r.refclassid, r.refobjid, 0) a
LEFT JOIN LATERAL (
    SELECT e.extname::text, en.nspname::text FROM pg_catalog.pg_depend x
    JOIN pg_catalog.pg_extension e ON e.oid = x.refobjid JOIN pg_catalog.pg_namespace en ON en.oid = e.extnamespace
    WHERE x.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND x.deptype = 'e' AND x.classid = r.refclassid
      AND x.objid = coalesce((SELECT NULLIF(t.typelem, 0::pg_catalog.oid) FROM pg_catalog.pg_type t
                              WHERE r.refclassid = 'pg_catalog.pg_type'::pg_catalog.regclass AND t.oid = r.refobjid AND t.typcategory = 'A'), r.refobjid)
    LIMIT 1) ext ON true
WHERE i.schema NOT IN (%(schema)s, 'pg_catalog', 'information_schema', 'pgidgen')
  AND i.type <> 'index'  -- a foreign key's unique index: its table is named
ORDER BY 4
"""

#: EXTERNAL_REFERENCES_SQL for a batch's schemas: what they use outside all of them.
EXTERNAL_REFERENCES_ANY_SQL = EXTERNAL_REFERENCES_SQL.replace(
    "WHERE nspname = %(schema)s", "WHERE nspname = ANY(%(schemas)s)").replace(
    "WHERE i.schema NOT IN (%(schema)s, ", "WHERE i.schema <> ALL(%(schemas)s) AND i.schema NOT IN (")
assert "%(schema)s" not in EXTERNAL_REFERENCES_ANY_SQL

#: Every privilege the owners of a schema's objects granted (their effective ACLs, the default ones where none
#: was written), as (kind, name, column, grantee, privilege, grantable), names quoted for GRANT/REVOKE: what a
#: restore reproduces only on a server without default privileges for the restoring role (ALTER DEFAULT
#: PRIVILEGES adds to, or takes from, what pg_dump's script grants). Grants made by others come from pg_dump.
OWNER_GRANTS_SQL = """
WITH n AS (SELECT oid, nspowner, nspacl FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),
o (kind, name, col, owner, acl) AS (
    SELECT 'SCHEMA', NULL::text, NULL::text, n.nspowner, coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner)) FROM n
  UNION ALL
    SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, pg_catalog.quote_ident(c.relname), NULL, c.relowner,
           coalesce(c.relacl, pg_catalog.acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", c.relowner))
    FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  UNION ALL
    SELECT 'TABLE', pg_catalog.quote_ident(c.relname), pg_catalog.quote_ident(a.attname), c.relowner, a.attacl
    FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
  UNION ALL
    SELECT 'ROUTINE', p.oid::pg_catalog.regprocedure::text, NULL,  -- schema-qualified (run with an empty search_path)
           p.proowner, coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))
    FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid
  UNION ALL
    SELECT 'TYPE', pg_catalog.quote_ident(t.typname), NULL, t.typowner, coalesce(t.typacl, pg_catalog.acldefault('T', t.typowner))
    FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid
    WHERE t.typtype IN ('b', 'd', 'e', 'r', 'm') OR t.typtype = 'c' AND (SELECT relkind FROM pg_catalog.pg_class WHERE oid = t.typrelid) = 'c')
SELECT o.kind, o.name, o.col, CASE WHEN e.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(e.grantee)) END,
       e.privilege_type, e.is_grantable
FROM o, pg_catalog.aclexplode(o.acl) e WHERE e.grantor = o.owner
  AND NOT (e.privilege_type = 'MAINTAIN' AND e.grantee = o.owner)  -- every owner's own on 17+, unknown before
"""



def _owner_grants_many() -> str:
    text = OWNER_GRANTS_SQL
    for a, b in (
        ("WITH n AS (SELECT oid, nspowner, nspacl FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),",
         "WITH n AS (SELECT oid, nspname, nspowner, nspacl FROM pg_catalog.pg_namespace WHERE nspname = ANY(%(schemas)s)),"),
        ("o (kind, name, col, owner, acl) AS (", "o (nsp, kind, name, col, owner, acl) AS ("),
        ("    SELECT 'SCHEMA', NULL::text", "    SELECT n.nspname, 'SCHEMA', NULL::text"),
        ("    SELECT CASE c.relkind WHEN 'S'", "    SELECT n.nspname, CASE c.relkind WHEN 'S'"),
        ("    SELECT 'TABLE', pg_catalog.quote_ident(c.relname), pg_catalog.quote_ident(a.attname)",
         "    SELECT n.nspname, 'TABLE', pg_catalog.quote_ident(c.relname), pg_catalog.quote_ident(a.attname)"),
        ("    SELECT 'ROUTINE',", "    SELECT n.nspname, 'ROUTINE',"),
        ("    SELECT 'TYPE',", "    SELECT n.nspname, 'TYPE',"),
        ("SELECT o.kind, o.name, o.col,", "SELECT o.nsp, o.kind, o.name, o.col,"),
    ):
        assert text.count(a) == 1, a
        text = text.replace(a, b)
    return text


#: OWNER_GRANTS_SQL for a batch's schemas at once, each row led by its schema's name.
OWNER_GRANTS_MANY_SQL = _owner_grants_many()

def _grant_on(schema: str, kind: str, name: str | None, col: str | None, priv: str) -> str:
    what = "SCHEMA " + ident(schema) if kind == "SCHEMA" else f"{kind} {name}" if kind == "ROUTINE" else f"{kind} {ident(schema)}.{name}"
    return f"{priv} ({col}) ON {what}" if col else f"{priv} ON {what}"


def revoke_grants_sql(schema: str, source: set[tuple[Any, ...]], target: set[tuple[Any, ...]]) -> str:
    """REVOKE (run as a superuser: as the owner) what the owners granted on the target only. A table's REVOKE
    takes the same privilege on its columns too: grant_missing_sql, run after, puts back what the source has."""
    plain = {e[:5] for e in source}
    return "\n".join(
        f"REVOKE GRANT OPTION FOR {_grant_on(schema, k, n, c, p)} FROM {g};" if (k, n, c, g, p) in plain  # only the option differs
        else f"REVOKE {_grant_on(schema, k, n, c, p)} FROM {g};"
        for k, n, c, g, p, _ in sorted(target - source, key=str))


def grant_missing_sql(schema: str, source: set[tuple[Any, ...]], target: set[tuple[Any, ...]]) -> str:
    return "\n".join(f"GRANT {_grant_on(schema, k, n, c, p)} TO {g}{' WITH GRANT OPTION' if opt else ''};"
                     for k, n, c, g, p, opt in sorted(source - target, key=str))


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


def retire_sql(shard: int, schema: str, retired: str, tables: Sequence[TableRef], target: str) -> str:
    """Rename the source copy (late writers by name get 'does not exist'), guard its tables with an always-on
    trigger (writers with cached plans or the new name get a loud error; partitioned parents get one too, as a
    statement trigger on a partition does not fire for rows routed through its parent), retire its catalog row."""
    lines = [f"ALTER SCHEMA {ident(schema)} RENAME TO {ident(retired)};"]
    for t in tables:
        q = ident(retired, t.name)
        lines.append(
            f"CREATE TRIGGER pgidgen_retired BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {q}"
            f" FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.refuse_write({literal(str(shard))}, {literal(target)});"
        )
        lines.append(f"ALTER TABLE {q} ENABLE ALWAYS TRIGGER pgidgen_retired;")
    lines.append(
        f"UPDATE pgidgen.shards SET state = 'retired', schema_name = {literal(retired)}, updated_at = now() WHERE shard = {shard};"
    )
    return "\n".join(lines) + "\n"


def unretire_sql(shard: int, schema: str, retired: str, tables: Sequence[str]) -> str:
    """The rollback of retire_sql, for a move interrupted between the source flip and the target flip."""
    lines = [f"DROP TRIGGER IF EXISTS pgidgen_retired ON {ident(retired, t)};" for t in tables]
    lines.append(f"ALTER SCHEMA {ident(retired)} RENAME TO {ident(schema)};")
    lines.append(f"UPDATE pgidgen.shards SET state = 'active', schema_name = {literal(schema)}, updated_at = now() WHERE shard = {shard};")
    return "\n".join(lines) + "\n"


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
    """On the target, one transaction: carry user sequences, move the generator past everything the source issued
    (and past the source's clock at the flip, estimated from the target's clock plus the measured skew), go
    active, stop applying."""
    lines = [
        f"SELECT pg_catalog.setval({literal(ident(schema, s.name))}, {s.last_value}, {str(s.is_called).lower()});" for s in sequences
    ]
    lines.append(
        f"SELECT pgidgen.advance_generator({shard}, greatest({last_id}::bigint,"
        f" pgidgen.max_id(clock_timestamp() + interval '{ahead_ms} milliseconds')));"
    )
    lines.append(f"UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = {shard} AND state = 'incoming';")
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
