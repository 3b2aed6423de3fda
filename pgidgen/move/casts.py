"""A shard's own casts follow it to the target.

CREATE CAST makes an object without a schema, so `pg_dump --schema=shard_N` (the schema a move copies) leaves it
out, even when its types and its function are the shard's (an app's schema taken with `apply-ddl --from-schema`
brings its casts into every shard). A cast whose source type, target type or function lives in a moving schema
is the shard's: sqltext's dependents give it that schema, so it does not count as an object outside the shard
that would stop the move, and DROP SCHEMA ... CASCADE takes it with the schema (the source's copy at cleanup,
the target's at a rollback). The copy step creates it on the target, in the transaction that restores the
schema, with the shard's types and functions under the target schema's name.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

#: The casts made by CREATE CAST that name a type or function of the schemas: how each is made, and each type and function as
#: (schema, name, the name format_type gives it with search_path = '': qualified unless in pg_catalog).
CASTS_SQL = """
SELECT k.castcontext::text, k.castmethod::text,
       ARRAY[sn.nspname::text, s.typname::text, pg_catalog.format_type(s.oid, NULL)],
       ARRAY[tn.nspname::text, t.typname::text, pg_catalog.format_type(t.oid, NULL)],
       fn.nspname::text, f.proname::text,
       (SELECT pg_catalog.array_agg(ARRAY[an.nspname::text, a.typname::text, pg_catalog.format_type(a.oid, NULL)] ORDER BY o.n)
          FROM pg_catalog.unnest(f.proargtypes::pg_catalog.oid[]) WITH ORDINALITY AS o (t, n)
          JOIN pg_catalog.pg_type a ON a.oid = o.t JOIN pg_catalog.pg_namespace an ON an.oid = a.typnamespace)
FROM pg_catalog.pg_cast k
JOIN pg_catalog.pg_type s ON s.oid = k.castsource JOIN pg_catalog.pg_namespace sn ON sn.oid = s.typnamespace
JOIN pg_catalog.pg_type t ON t.oid = k.casttarget JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_proc f ON f.oid = k.castfunc LEFT JOIN pg_catalog.pg_namespace fn ON fn.oid = f.pronamespace
WHERE (sn.nspname = ANY(%(schemas)s) OR tn.nspname = ANY(%(schemas)s) OR fn.nspname = ANY(%(schemas)s))
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d  -- made with a type (a range's to its multirange), or an extension's
                  WHERE d.classid = 'pg_catalog.pg_cast'::pg_catalog.regclass AND d.objid = k.oid AND d.deptype IN ('i', 'e'))
ORDER BY k.oid
"""

_CONTEXT = {"e": "", "a": " AS ASSIGNMENT", "i": " AS IMPLICIT"}


def _type(named: Mapping[str, str], t: list[str]) -> sql.Composable:
    schema, name, formatted = t
    return sql.Identifier(named[schema], name) if schema in named else sql.SQL(formatted)


def casts_sql(conn: psycopg.Connection[Any], named: Mapping[str, str]) -> str:
    """CREATE CAST statements for the casts of the schemas named's keys (on conn, the source), each of their
    types and functions under the schema named maps it to (the target's name for it). Empty when there are none.
    Runs in a transaction of its own (its search_path = '' has format_type qualify every other type)."""
    with conn.transaction():
        conn.execute("SET LOCAL search_path = ''")
        rows = conn.execute(CASTS_SQL, {"schemas": list(named)}).fetchall()
    out = []
    for context, method, source, target, fschema, fname, args in rows:
        how: sql.Composable
        if method == "f":
            function = sql.Identifier(named[fschema], fname) if fschema in named else sql.Identifier(fschema, fname)
            how = sql.SQL("WITH FUNCTION {}({})").format(function, sql.SQL(", ").join(_type(named, a) for a in args or []))
        else:
            how = sql.SQL("WITH INOUT" if method == "i" else "WITHOUT FUNCTION")
        out.append(sql.SQL("CREATE CAST ({} AS {}) {}{};\n").format(
            _type(named, source), _type(named, target), how, sql.SQL(_CONTEXT[context])).as_string(conn))
    return "".join(out)
