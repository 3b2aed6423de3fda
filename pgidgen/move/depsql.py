"""A move's catalog checks, as SQL: which objects a shard's schema owns (a cast, a row type, an index), what outside
it depends on them (views, foreign keys, defaults: a move or a cleanup must not break them), what the shard uses
from outside (the target must have it), and the privileges its objects grant (carried to the target as they were).
Split from sqltext.py, where the rest of a move's SQL is rendered."""
from __future__ import annotations

from typing import Any

from .sqltext import ident, on_schema, relations_of

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
    """The relations, types and functions of the schema named by schema_param, as (catalog, oid), found through
    pg_depend's index (none of the three catalogs has one on the schema: a pass over each took some 70 ms a batch
    at 2000 shards): functions and types depend on their schema, relations as relations_of finds them; a type's
    array and a relation's row type (and its array) through their oids (tests/test_move_schemacache.py holds it to
    the passes over the catalogs). Duplicates are harmless: the dependents are DISTINCT."""
    n = f"(SELECT oid FROM pg_catalog.pg_namespace WHERE oid = pg_catalog.to_regnamespace({schema_param}))"
    with_array = "JOIN pg_catalog.pg_type t ON t.oid = {of}, LATERAL (VALUES (t.oid), (t.typarray)) x (oid) WHERE x.oid <> 0"
    return f"""
    SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, d.objid FROM {n} n {on_schema('pg_proc')}
    UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, x.oid FROM {n} n {on_schema('pg_type')} {with_array.format(of='d.objid')}
    UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, x.oid FROM ({relations_of(n, 'c.reltype')}) r (reltype) {with_array.format(of='r.reltype')}
    UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, r.oid FROM ({relations_of(n, 'c.oid')}) r (oid)"""


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
#: Every retired copy's tables have a trigger calling pgidgen.refuse_write (q.retire_sql): some 10,000 dependents
#: at 8192 shards, each one's schema worked out, made this 0.5 s a batch. That function's triggers are looked for
#: apart, on the batch's tables only.
DEPENDS_ON_CATALOG_ANY_SQL = _dependents_sql(
    "'pgidgen'",
    """SELECT EXISTS (SELECT FROM owner WHERE schema = ANY(%(schemas)s)) OR EXISTS (
    SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
    WHERE t.tgfoid = pg_catalog.to_regproc('pgidgen.refuse_write')
      AND c.relnamespace IN (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = ANY(%(schemas)s)))""",
    objects=f"""SELECT c, o FROM ({_objects_sql("'pgidgen'")}) a (c, o)
    WHERE (c, o) IS DISTINCT FROM ('pg_catalog.pg_proc'::pg_catalog.regclass, pg_catalog.to_regproc('pgidgen.refuse_write')::pg_catalog.oid)""",
)

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
rels AS MATERIALIZED (""" + relations_of("n", "c.oid") + """),  -- read once, through pg_depend's index
d (classid, objid) AS (
    SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid FROM rels c
    UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, co.oid FROM pg_catalog.pg_constraint co JOIN n ON co.connamespace = n.oid
    UNION ALL SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass, ad.oid FROM pg_catalog.pg_attrdef ad
              JOIN rels c ON c.oid = ad.adrelid
    UNION ALL SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass, r.oid FROM pg_catalog.pg_rewrite r
              JOIN rels c ON c.oid = r.ev_class
    UNION ALL SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass, tg.oid FROM pg_catalog.pg_trigger tg
              JOIN rels c ON c.oid = tg.tgrelid
    UNION ALL SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass, po.oid FROM pg_catalog.pg_policy po
              JOIN rels c ON c.oid = po.polrelid),
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
        # a batch's schemas' objects through pg_depend's index (each depends on its schema), not a pass over pg_class,
        # pg_proc and pg_type, which have no index on the schema (some 80 ms a side per batch at 2000 shards)
        ("    FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid WHERE",
         f"    FROM n {on_schema('pg_class')} JOIN pg_catalog.pg_class c ON c.oid = d.objid WHERE"),
        ("    FROM pg_catalog.pg_class c JOIN n ON c.relnamespace = n.oid\n",
         f"    FROM n {on_schema('pg_class')} JOIN pg_catalog.pg_class c ON c.oid = d.objid\n"),
        ("    FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid", f"    FROM n {on_schema('pg_proc')} JOIN pg_catalog.pg_proc p ON p.oid = d.objid"),
        ("    FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid", f"    FROM n {on_schema('pg_type')} JOIN pg_catalog.pg_type t ON t.oid = d.objid"),
    ):
        assert text.count(a) == 1, a
        text = text.replace(a, b)
    return text


#: OWNER_GRANTS_SQL for a batch's schemas at once, each row led by its schema's name (tests/test_move_schemacache.py
#: holds it to OWNER_GRANTS_SQL's pass over the catalogs, schema by schema).
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
