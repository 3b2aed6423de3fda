"""Online statements: the ones apply-ddl runs shard by shard outside a transaction, and their SQL.

`CREATE INDEX CONCURRENTLY`, `REINDEX ... CONCURRENTLY` and `DROP INDEX CONCURRENTLY` cannot run in a transaction
block; `ALTER TABLE ... VALIDATE CONSTRAINT` can, but on a big table it scans for long, so it is better committed
shard by shard too. None of them takes a lock the application's reads and writes queue behind (SHARE UPDATE
EXCLUSIVE at most). The rule for files: a file whose statements are all of these kinds is *online* (online.py runs
it); a CONCURRENTLY statement in a file with any other statement is refused (split the file); a VALIDATE in a file
of ordinary statements runs in the transaction as before.

A killed or failed build leaves an index marked invalid (pg_index.indisvalid = false) under its name, or a
`<name>_ccnew` one from a REINDEX: the next run finds it by name, drops it concurrently and builds again. So an
online CREATE INDEX must name its index.

Init's replay gives brand-new, empty shards the whole ledger in one transaction: there an online file runs as its
plain form (CONCURRENTLY taken out), which is the same on an empty table.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pglast import ast, parse_sql
from pglast.enums import AlterTableType, ObjectType
from pglast.stream import RawStream

from ..idgen import schema_name
from .names import Refused, names

#: invalid indexes a failed REINDEX ... CONCURRENTLY leaves beside the index it rebuilt
REINDEX_LEFTOVERS = ("%\\_ccnew%", "%\\_ccold%")


@dataclass(frozen=True)
class Step:
    """One online statement of a file, as a template (the schema placeholder in it)."""

    kind: str  # "create index" | "drop index" | "reindex" | "validate"
    sql: str
    index: str | None = None  # the index a CREATE INDEX or DROP INDEX names (no schema)


def concurrent(s: Any) -> bool:
    """A statement that must run outside a transaction block."""
    if isinstance(s, (ast.IndexStmt, ast.DropStmt)):
        return bool(s.concurrent)
    if isinstance(s, ast.ReindexStmt):
        return any(p.defname == "concurrently" and _true(p) for p in s.params or ())
    return False


def validates(s: Any) -> bool:
    cmds = s.cmds if isinstance(s, ast.AlterTableStmt) else None
    return bool(cmds) and all(getattr(c, "subtype", None) == AlterTableType.AT_ValidateConstraint for c in cmds or ())


def _true(p: ast.DefElem) -> bool:
    arg = p.arg
    if arg is None:
        return True
    value = getattr(arg, "sval", None) or getattr(getattr(arg, "val", None), "sval", None) or getattr(arg, "boolval", None)
    return str(value).lower() not in ("false", "off", "0", "no")


def check_online(s: Any) -> None:
    """What an online statement must say for a re-run to find what a killed one left."""
    if isinstance(s, ast.IndexStmt) and s.concurrent and not s.idxname:
        raise Refused("CREATE INDEX CONCURRENTLY needs an index name",
                      "name the index (CREATE INDEX CONCURRENTLY t_v_idx ON t (v)): a re-run finds an invalid one left by a failed build by its name")
    if isinstance(s, ast.ReindexStmt) and s.kind not in (0, 1):  # REINDEX_OBJECT_INDEX, REINDEX_OBJECT_TABLE
        raise Refused("pgidgen reindexes one index or one table at a time", "write REINDEX INDEX CONCURRENTLY name or REINDEX TABLE CONCURRENTLY name")


def _step(s: Any, sql: str) -> Step:
    if isinstance(s, ast.IndexStmt):
        return Step("create index", sql, index=s.idxname)
    if isinstance(s, ast.DropStmt):
        objects = s.objects or ()
        if s.removeType != ObjectType.OBJECT_INDEX or len(objects) != 1:  # pragma: no cover - the server refuses these
            return Step("drop index", sql)
        return Step("drop index", sql, index=names(objects[0])[-1])
    if isinstance(s, ast.ReindexStmt):
        return Step("reindex", sql)
    return Step("validate", sql)


@lru_cache(maxsize=64)
def online_steps(template: str) -> tuple[Step, ...] | None:
    """The steps of an online file's template; None for a file that runs in a transaction."""
    stmts = [raw.stmt for raw in parse_sql(template)]
    if not stmts or not any(concurrent(s) for s in stmts) and not all(validates(s) for s in stmts):
        return None
    if not all(concurrent(s) or validates(s) for s in stmts):  # pragma: no cover - parse_file refuses such a file
        return None
    return tuple(_step(s, RawStream()(s)) for s in stmts)  # type: ignore[arg-type]


@lru_cache(maxsize=64)
def in_transaction(template: str) -> str:
    """The template as it can run in a transaction block: CONCURRENTLY taken out (for new, empty shards)."""
    if "concurrently" not in template.lower():
        return template
    out = []
    for raw in parse_sql(template):
        s = raw.stmt
        if isinstance(s, (ast.IndexStmt, ast.DropStmt)):
            s.concurrent = False
        elif isinstance(s, ast.ReindexStmt):
            s.params = tuple(p for p in s.params or () if p.defname != "concurrently") or None
        out.append(RawStream()(s) + ";\n")  # type: ignore[arg-type]
    return "".join(out)


def search_path(shard: int) -> str:
    return f"SET search_path = {schema_name(shard)}, pg_catalog, pg_temp"


def for_shard(step: Step, placeholder: str, shard: int) -> str:
    return step.sql.replace(placeholder, schema_name(shard))


#: the validity of an index of a shard (no row: there is none)
INDEX_SQL = ("SELECT i.indisvalid FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid"
             " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s")
#: invalid indexes a failed REINDEX CONCURRENTLY left in a shard
LEFTOVERS_SQL = ("SELECT c.relname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid"
                 " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                 " WHERE n.nspname = %s AND NOT i.indisvalid AND (c.relname LIKE %s OR c.relname LIKE %s) ORDER BY 1")
#: the sessions a statement waits for (its lock, or CONCURRENTLY's wait for older transactions), the oldest first
BLOCKERS_SQL = """
SELECT a.pid, coalesce(a.application_name, ''), extract(epoch FROM pg_catalog.now() - a.xact_start)::float8,
       pg_catalog.left(pg_catalog.regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 60), ''
FROM pg_catalog.pg_stat_activity a WHERE a.pid = ANY(pg_catalog.pg_blocking_pids(%s))
ORDER BY 3 DESC NULLS LAST, 1
"""


def render_online(steps: tuple[Step, ...], placeholder: str, shard: int, ledger_rows: str) -> str:
    """What the executor runs on one shard, each statement on its own outside a transaction (for --sql)."""
    schema = schema_name(shard)
    out = [search_path(shard) + ";\n"]
    for step in steps:
        if step.kind == "create index":
            out.append(f"-- if {schema}.{step.index} exists: valid, this statement is skipped; invalid (an earlier build failed),"
                       f" DROP INDEX CONCURRENTLY {schema}.{step.index} first\n")
        elif step.kind == "drop index":
            out.append(f"-- skipped if {schema}.{step.index} no longer exists\n")
        elif step.kind == "reindex":
            out.append(f"-- invalid {schema}.*_ccnew / *_ccold indexes an earlier REINDEX left are dropped concurrently first\n")
        out.append(for_shard(step, placeholder, shard) + ";\n")
    return "".join(out) + "RESET search_path;\n" + ledger_rows


def quoted(schema: str, name: str) -> str:
    """schema.name for a DROP INDEX built from the catalog's names (identifiers quoted as literals are not)."""
    from psycopg import sql

    return sql.Composed([sql.Identifier(schema), sql.SQL("."), sql.Identifier(name)]).as_string(None)

