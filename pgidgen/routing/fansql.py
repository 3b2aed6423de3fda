"""The SQL of a fan-out (fanout.py): one statement written unqualified, as for Router.run, rewritten once into a
template for any shard, and the statement each database is sent for a chunk of its shards.

Why one statement over many shards and not one per shard: measured on 2000 shards over two databases (a "50 newest
rows" query), a pipeline of one claimed transaction per shard, each setting the shard's search_path, took 4.5x a
hand-written UNION ALL per database; the same pipeline with each shard's statement qualified instead, 1.6x; a
UNION ALL over the shards, qualified and claimed by claim_shard in the same transaction, 0.9-1.2x (and with its plan
prepared, the same as the hand-written one prepared). So each database gets, per chunk of its shards, one
statement: the user's statement once per shard, its names qualified with that shard's schema, joined by UNION ALL.

How names resolve: as under Router.run's search_path (the shard's schema, then the Router's others), every name of
a relation, function or type that the shard's schema has is qualified with it (the shard schemas hold the same
objects: sharded DDL keeps them so); every other name is left as written and resolves by the Router's other schemas
(public), which the chunk's transaction sets as its search_path. The names a shard schema holds are read once from
the database (NAMES_SQL) and again if a statement finds one missing.

The ORDER BY and LIMIT of a fan-out go to every shard (each returns at most `limit` rows, sorted) and over the
chunk's union (the server merges the chunk's shards: one sorted stream of at most `limit` rows per chunk), and the
client merges the chunks' streams (fanout.py)."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream
from pglast.visitors import Visitor
from psycopg import sql

from ..errors import InputError
from ..idgen import schema_name

PLACEHOLDER = "pgidgen_fan_out_schema"
#: the column with_shard adds in front of each row
SHARD_COLUMN = "shard"
#: The shards of a database read by one statement in one transaction. Each shard's relations are locked until the
#: transaction ends (a table and, for planning, its indexes: ~3 locks a shard for one table, from a lock table of
#: max_locks_per_transaction x max_connections, 6400 by default), and planning a union costs about the same per
#: shard whatever its size (measured: 100, 200 and 1000 shards a statement within noise), so chunks stay small.
CHUNK = 100

#: the relations, functions and types of one shard's schema: the names a fan-out qualifies
NAMES_SQL = (
    "WITH n AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = {schema})"
    " SELECT 'r', c.relname FROM pg_catalog.pg_class c, n WHERE c.relnamespace = n.oid"
    " UNION ALL SELECT 'f', p.proname FROM pg_catalog.pg_proc p, n WHERE p.pronamespace = n.oid"
    " UNION ALL SELECT 't', t.typname FROM pg_catalog.pg_type t, n WHERE t.typnamespace = n.oid"
)
#: each chunk's claim: the search_path of its statement (the Router's other schemas: a name the shard's schema
#: lacks resolves there, as in Router.run), and pgidgen.claim_shard(N, for_write) of shards $1: of every one for a
#: write (its claim lock); for a read, of those whose row here is not 'active' or 'moving', which claim_shard refuses
#: (PGR01), as it would refuse them in a read claim of each (which reads that row and takes no lock) — a read claim
#: of each cost 10 us a shard, a plpgsql call with its own search_path; the join, 2 us
CLAIM_SQL = (
    b"SELECT pg_catalog.set_config('search_path', $2, true),"
    b" (SELECT pg_catalog.count(pgidgen.claim_shard(a.s, $3)) FROM pg_catalog.unnest($1::pg_catalog.int4[]) AS a(s)"
    b" LEFT JOIN pgidgen.shards AS t ON t.shard OPERATOR(pg_catalog.=) a.s"
    b" AND t.state OPERATOR(pg_catalog.=) ANY ('{active,moving}'::pg_catalog.text[])"
    b" WHERE $3 OR t.shard IS NULL)"
)
CLAIM_TYPES = (1007, 25, 16)  # int4[], text, bool
_WRITES = {"InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE", "MergeStmt": "MERGE"}
_ORDER = re.compile(r"^\s*(-?)\s*(\S+?)\s*(?:\s(asc|desc))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Order:
    """One key of a fan-out's order: an output column of the statement, and its direction (PostgreSQL's NULLS
    placement: last ascending, first descending)."""

    column: str
    descending: bool = False


def parse_order(order_by: str | Sequence[str] | None) -> tuple[Order, ...]:
    """order_by as given: a column name, "-name" or "name DESC" for descending, or a sequence of them."""
    if order_by is None:
        return ()
    items = [order_by] if isinstance(order_by, str) else list(order_by)
    out: list[Order] = []
    for item in items:
        for part in str(item).split(","):
            m = _ORDER.match(part)
            if m is None or (m.group(1) and m.group(3)):
                raise InputError(f"order_by {item!r} is not a column name with an optional direction",
                                 hint="write it like id, -id or 'id DESC' (an output column of the statement), several separated by commas")
            out.append(Order(m.group(2), bool(m.group(1)) or (m.group(3) or "").lower() == "desc"))
    return tuple(out)


@dataclass(frozen=True)
class ShardNames:
    """The names one shard's schema holds (every shard's schema holds the same ones)."""

    relations: frozenset[str]
    functions: frozenset[str]
    types: frozenset[str]

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, str]]) -> ShardNames:
        kinds: dict[str, set[str]] = {"r": set(), "f": set(), "t": set()}
        for kind, name in rows:
            kinds[kind].add(name)
        return cls(frozenset(kinds["r"]), frozenset(kinds["f"]), frozenset(kinds["t"]))


@dataclass(frozen=True)
class Template:
    """The statement for any shard: its text split where the shard's schema goes."""

    pieces: tuple[str, ...]
    #: a write (INSERT, UPDATE, DELETE, MERGE): each shard's goes into the chunk's WITH
    writes: bool
    #: it returns rows (a SELECT; a write with RETURNING)
    returns: bool
    #: SELECT, INSERT, UPDATE, DELETE or MERGE
    kind: str = "SELECT"

    def check(self, read_only: bool) -> None:
        if self.writes and read_only:
            raise InputError(f"the statement is an {self.kind}, and the fan-out is read-only",
                             hint="Router.fan_out(..., read_only=False) writes to every shard (pgidgen query only reads)")

    def for_shard(self, shard: int) -> str:
        return sql.Identifier(schema_name(shard)).as_string(None).join(self.pieces)


class _Names(Visitor):
    def __init__(self, names: ShardNames, placeholder: str) -> None:
        super().__init__()
        self.names = names
        self.placeholder = placeholder
        self.ctes: set[str] = set()

    def visit_CommonTableExpr(self, ancestors: Any, node: ast.CommonTableExpr) -> None:
        if node.ctename:
            self.ctes.add(node.ctename)


class _Qualifier(_Names):
    """Qualifies what the shard's schema has; leaves the rest to the search_path (a CTE's name is its own)."""

    def visit_RangeVar(self, ancestors: Any, node: ast.RangeVar) -> None:
        if node.schemaname is None and node.relname not in self.ctes and node.relname in self.names.relations:
            node.schemaname = self.placeholder

    def visit_FuncCall(self, ancestors: Any, node: ast.FuncCall) -> None:
        names = [n.sval for n in node.funcname or ()]
        if len(names) == 1 and names[0] in self.names.functions:
            node.funcname = (ast.String(sval=self.placeholder), ast.String(sval=names[0]))

    def visit_TypeName(self, ancestors: Any, node: ast.TypeName) -> None:
        names = [getattr(n, "sval", None) for n in node.names or ()]
        if len(names) == 1 and names[0] in self.names.types:
            node.names = (ast.String(sval=self.placeholder), ast.String(sval=str(names[0])))


def rewrite(text: str, names: ShardNames) -> Template:
    """The template of one statement (its parameters as $1, $2...: psycopg's conversion of the caller's query)."""
    try:
        raws = parse_sql(text)
    except ParseError as e:
        raise InputError(f"the statement cannot be parsed: {e.args[0]}", hint="fix the SQL; nothing was run") from None
    if len(raws) != 1:
        raise InputError(f"a fan-out runs one statement, not {len(raws)}", hint="run them one by one")
    stmt = raws[0].stmt
    assert stmt is not None
    kind = type(stmt).__name__
    if kind != "SelectStmt" and kind not in _WRITES:
        words = re.findall(r"[A-Za-z]+", text[raws[0].stmt_location or 0:])[:2]
        what = " ".join(words if words[:1] and words[0].upper() in ("CREATE", "ALTER", "DROP") else words[:1]).upper()
        raise InputError(f"a fan-out runs a SELECT (or an INSERT, UPDATE, DELETE) on every shard, not {what}",
                         hint="DDL goes to every shard by 'pgidgen apply-ddl'; anything else, by Router.run on each shard")
    placeholder = PLACEHOLDER
    while placeholder in text:
        placeholder += "_"
    ctes = _Names(names, placeholder)
    ctes(stmt)
    qualify = _Qualifier(names, placeholder)
    qualify.ctes = ctes.ctes
    qualify(stmt)
    try:
        out = RawStream()(stmt)
    except Exception as e:  # pglast cannot print some exotic nodes
        raise InputError(f"the statement cannot be rewritten for the shards: {type(e).__name__}: {e}",
                         hint="simplify it, or run it on each shard by Router.run") from None
    writes = kind in _WRITES
    returns = not writes or bool(getattr(stmt, "returningList", None) or getattr(stmt, "returningClause", None))
    return Template(tuple(out.split(placeholder)), writes, returns, _WRITES.get(kind, "SELECT"))


def _order_sql(order: Sequence[Order]) -> str:
    """ORDER BY output columns: by their bare names (an output column's name wins over an input column's)."""
    keys = ", ".join(f"{sql.Identifier(o.column).as_string(None)}{' DESC' if o.descending else ''}" for o in order)
    return f" ORDER BY {keys}" if keys else ""


def chunk_sql(template: Template, shards: Sequence[int], *, order: Sequence[Order] = (), limit: int | None = None,
              with_shard: bool = False) -> str:
    """One statement reading (or writing) shards, in their order: each shard's statement, ordered and limited, under
    UNION ALL; the union ordered and limited again (the server merges them). A write goes into the WITH of a SELECT of
    what it returns (a data-modifying statement runs once there, returning or not)."""
    tail = _order_sql(order) + (f" LIMIT {int(limit)}" if limit is not None else "")
    wrap = with_shard or bool(tail)
    ctes: list[str] = []
    parts: list[str] = []
    for i, shard in enumerate(shards):
        text = template.for_shard(shard)
        if template.writes:
            ctes.append(f"p{i} AS ({text})")
            text, wrap_this = f"SELECT * FROM p{i}", True
        else:
            wrap_this = wrap
        if wrap_this:
            head = f"{shard} AS {SHARD_COLUMN}, " if with_shard else ""
            text = f"SELECT {head}q.* FROM ({text}) AS q{tail}"
        parts.append(f"({text})")
    if template.writes and not template.returns:
        body = "SELECT WHERE false"
    else:
        body = " UNION ALL ".join(parts)
        outer = _order_sql(order) + (f" LIMIT {int(limit)}" if limit is not None else "")
        if outer and len(parts) > 1:
            body = f"SELECT * FROM ({body}) AS u{outer}"
    return (f"WITH {', '.join(ctes)} " if ctes else "") + body


def claim_params(shards: Sequence[int], search_path: str, for_write: bool) -> list[bytes | None]:
    return [("{" + ",".join(map(str, shards)) + "}").encode("ascii"), search_path.encode("utf-8"), b"t" if for_write else b"f"]


def claim_text(shards: Sequence[int], search_path: str, for_write: bool) -> str:
    """CLAIM_SQL with its arguments as literals (the rendering twin's)."""
    values = {"1": "{" + ",".join(map(str, shards)) + "}", "2": search_path, "3": for_write}
    return re.sub(r"\$([123])", lambda m: sql.Literal(values[m.group(1)]).as_string(None), CLAIM_SQL.decode())


__all__ = ["CHUNK", "CLAIM_SQL", "NAMES_SQL", "Order", "SHARD_COLUMN", "ShardNames", "Template", "chunk_sql", "parse_order", "rewrite"]
