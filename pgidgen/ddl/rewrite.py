"""Where sharded DDL is rewritten: a file written once, unqualified, becomes one SQL template per shard.

pglast parses the file into statements; each statement is checked against what can be sharded safely, its
unqualified relations are qualified with a placeholder schema (and `next_id()` bound to the shard's
generator), and it is deparsed on its own. Rendering a shard is then a string replacement of the placeholder,
so 2000 shards cost 2000 replacements, not 2000 parses.

Rules, in one place:
- every unqualified relation, and every function or type the file itself creates, goes into the shard; only
  references to `pg_*` relations stay unqualified (system catalogs and views such as pg_class, pg_stat_activity:
  the shard's search_path reaches pg_catalog after the shard); a name already qualified with the placeholder
  is the shard's too (a schema dump's own names, dumpfile.py);
- what a schema holds besides tables, types and functions (aggregates, operators, operator classes and
  families, collations, text search objects, rules, statistics, casts of the shard's own types) is named in the
  shard the same way; names.py says, by kind, what a statement may create or change;
- `next_id()` is the shard's generator;
- relations qualified by the user (`public.countries`) stay as written, but may only be *referenced*: a
  statement that would create or change them would run once per shard;
- the `pgidgen` catalog's and other shards' objects are out of bounds (pgidgen's SQL functions may be called);
- functions go into the shard with `search_path` pinned to the shard, then pg_catalog, then pg_temp (a dump's
  functions: its extensions' schemas before pg_temp, and a search_path of their own turned into the shard's);
- the rendered SQL for a shard starts with `SET LOCAL search_path` to the same list, so what the file leaves
  unqualified resolves the same way in the DDL as in the functions.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pglast import ast, parse_sql
from pglast.enums import AlterTableType, GrantTargetType, ObjectType
from pglast.parser import ParseError
from pglast.stream import RawStream
from pglast.visitors import Visitor

from ..errors import InputError
from ..idgen import schema_name
from . import printfix  # noqa: F401  (pglast's printer, fixed where it writes wrong SQL)
from .names import (
    FUNC_OBJECTS,
    ON_TABLE_OBJECTS,
    REL_OBJECTS,
    SHARD_RE,
    TYPE_OBJECTS,
    Refused,
    changed_parent,
    check_bound_early,
    check_relation_literal,
    forbidden,
    names,
    objects_in_names,
    qualify_names,
    refuse_schema,
    shared_target,
    target_rangevar,
)
from .online_sql import check_online, concurrent, online_steps, validates
from .positions import _kind, _skip_space, line_col, parse_error_index

PLACEHOLDER = "pgidgen_shard_schema"
_BODY_SHARD_RE = re.compile(r'(?i)(?<![A-Za-z0-9_$])"?shard_[0-9]+"?\s*\.')
_NOT_DDL = {
    "SelectStmt": "SELECT",
    "InsertStmt": "INSERT",
    "UpdateStmt": "UPDATE",
    "DeleteStmt": "DELETE",
    "MergeStmt": "MERGE",
    "CopyStmt": "COPY",
    "CallStmt": "CALL",
    "DoStmt": "DO",
    "TruncateStmt": "TRUNCATE",
    "ExplainStmt": "EXPLAIN",
    "VacuumStmt": "VACUUM/ANALYZE",
    "LockStmt": "LOCK",
}
_RENAMES_ON_RELATIONS = REL_OBJECTS | ON_TABLE_OBJECTS | {ObjectType.OBJECT_ATTRIBUTE}


@dataclass(frozen=True)
class Statement:
    """One statement of a sharded file: where it is, what it is, and its SQL for any shard."""

    number: int
    line: int
    column: int
    kind: str
    template: str


@dataclass(frozen=True)
class ShardedFile:
    """A parsed and checked DDL file, ready to render for any shard."""

    name: str
    source: str
    sha256: str
    placeholder: str
    statements: tuple[Statement, ...]
    #: what a schema dump's reading took, turned and left out (dumpfile.py), for the output
    summary: tuple[str, ...] = ()
    #: (name, statement) of each extension a schema dump creates, checked in every database before anything runs
    extensions: tuple[tuple[str, str], ...] = ()

    @property
    def template(self) -> str:
        """The SQL for one shard with the placeholder in place of its schema (what the ledger stores)."""
        return "".join(s.template + ";\n" for s in self.statements)

    def for_shard(self, shard: int) -> str:
        return render_template(self.template, self.placeholder, shard)

    @property
    def online(self) -> bool:
        """Run shard by shard outside a transaction (online_sql.py says which files)."""
        return online_steps(self.template) is not None


def render_template(template: str, placeholder: str, shard: int) -> str:
    """One shard's SQL: the search_path the file's unqualified names resolve through, then the statements.

    The schema is written plain (shard_5, never quoted): the placeholder stands both in identifiers and inside
    string values (a function's SET search_path, a function body), and a generated name of the form shard_N
    reads the same in both. SHARD_RE guarantees it needs no quoting.
    """
    schema = schema_name(shard)
    if not SHARD_RE.match(schema):  # pragma: no cover - schema_name only makes such names
        raise InputError(f"unexpected shard schema name {schema!r}")
    return f"SET LOCAL search_path = {schema}, pg_catalog, pg_temp;\n" + template.replace(placeholder, schema)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- checking and rewriting ---------------------------------------------------------------------------


class _Qualifier(Visitor):
    """Qualifies one statement's names with the placeholder; refuses names pgidgen must not touch."""

    def __init__(self, placeholder: str, functions: set[str], types: set[str], ctes: set[str], targets: set[int]) -> None:
        super().__init__()
        self.placeholder = placeholder
        self.functions = functions
        self.types = types
        self.ctes = ctes
        self.targets = targets
        self.inserted = 0

    def _p(self) -> ast.String:
        self.inserted += 1
        return ast.String(sval=self.placeholder)

    def visit_RangeVar(self, ancestors: Any, node: ast.RangeVar) -> None:
        if node.catalogname:
            raise Refused(f"it names {node.catalogname}.{node.schemaname}.{node.relname} with a database name", "remove the database name")
        if node.schemaname is not None:
            if forbidden(node.schemaname):
                raise refuse_schema(node.schemaname, f"relation {node.relname}")
            return
        if node.relpersistence == "t":
            raise Refused("it creates a temporary table", "temporary tables are per session, not per shard: leave them out of sharded files")
        if id(node) not in self.targets and (node.relname in self.ctes or (node.relname or "").startswith("pg_")):
            return  # a CTE, or a system catalog or view: the shard's search_path finds a shard's own pg_* name first
        node.schemaname = self.placeholder
        self.inserted += 1

    def visit_FuncCall(self, ancestors: Any, node: ast.FuncCall) -> None:
        parts = names(node.funcname)
        if parts[-1] in ("nextval", "currval", "setval") and parts[:-1] in ([], ["pg_catalog"]) and node.args:
            check_relation_literal(node.args[0])
            check_bound_early(parts[-1], node.args[0])
        if len(parts) == 1:
            if (parts[0] == "next_id" and not node.args) or parts[0] in self.functions:
                node.funcname = (self._p(), ast.String(sval=parts[0]))
        elif len(parts) >= 2 and SHARD_RE.match(parts[-2]):
            raise refuse_schema(parts[-2], f"function {parts[-1]}()")

    def visit_TypeCast(self, ancestors: Any, node: ast.TypeCast) -> None:
        if node.typeName is not None and names(node.typeName.names)[-1:] == ["regclass"]:
            check_relation_literal(node.arg)

    def visit_TypeName(self, ancestors: Any, node: ast.TypeName) -> None:
        parts = names(node.names)
        if len(parts) == 1 and parts[0] in self.types:
            node.names = (self._p(), ast.String(sval=parts[0]))
        elif len(parts) >= 2 and forbidden(parts[-2]):
            raise refuse_schema(parts[-2], f"type {parts[-1]}")

    def visit_ObjectWithArgs(self, ancestors: Any, node: ast.ObjectWithArgs) -> None:
        # functions named in COMMENT/DROP/GRANT are the shard's own; their targets were checked already. An operator
        # class's members and a cast's function are found through the shard's search_path (built-ins included).
        if ancestors.find_nearest(ast.CreateOpClassItem) is not None or ancestors.find_nearest(ast.CreateCastStmt) is not None:
            return
        parts = names(node.objname)
        if len(parts) == 1:
            node.objname = (self._p(), ast.String(sval=parts[0]))


class _CteNames(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_CommonTableExpr(self, ancestors: Any, node: ast.CommonTableExpr) -> None:
        if node.ctename:
            self.names.add(node.ctename)


@dataclass
class FileScope:
    """What the whole file says that each statement needs: the functions and types it creates (unqualified
    references to them go into the shard), and, for a schema dump (dumpfile.py), how its own names and its
    functions' search_path are turned into the shard's."""

    functions: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)
    #: schemas every function's pinned search_path reaches after pg_catalog (a dump's extensions' schemas)
    path_tail: tuple[str, ...] = ()
    #: a dump's own search_path of a function, turned into the shard's (None: a function may not set its own)
    own_path: Callable[[list[str]], list[str]] | None = None
    #: a dump's names turned into the shard's: in a statement (a SQL body's too), and in other languages' bodies
    rename: Callable[[Any], None] | None = None
    rename_text: Callable[[str], str] | None = None


def collect_scope(stmts: Iterable[ast.RawStmt]) -> FileScope:
    scope = FileScope()
    for raw in stmts:
        s = raw.stmt
        if isinstance(s, ast.CreateFunctionStmt) or (isinstance(s, ast.DefineStmt) and s.kind == ObjectType.OBJECT_AGGREGATE):
            parts = names(s.funcname if isinstance(s, ast.CreateFunctionStmt) else s.defnames)
            if len(parts) == 1:
                scope.functions.add(parts[0])
        elif isinstance(s, (ast.CreateEnumStmt, ast.CreateDomainStmt, ast.CreateRangeStmt)):
            parts = names(s.domainname if isinstance(s, ast.CreateDomainStmt) else s.typeName)
            if len(parts) == 1:
                scope.types.add(parts[0])
        elif isinstance(s, ast.DefineStmt) and s.kind == ObjectType.OBJECT_TYPE and len(names(s.defnames)) == 1:
            scope.types.add(names(s.defnames)[0])
        elif isinstance(s, ast.CompositeTypeStmt) and s.typevar is not None and s.typevar.schemaname is None:
            scope.types.add(str(s.typevar.relname))
    return scope


def path_values(stmt: ast.VariableSetStmt) -> list[str]:
    out: list[str] = []
    for arg in stmt.args or ():
        if isinstance(arg, ast.A_Const) and isinstance(arg.val, ast.String):
            out += [v.strip().strip('"') for v in (arg.val.sval or "").split(",") if v.strip()]
    return out


def _pin_search_path(stmt: ast.CreateFunctionStmt, placeholder: str, scope: FileScope) -> None:
    options = list(stmt.options or ())
    for i, opt in enumerate(options):
        if opt.defname == "set" and isinstance(opt.arg, ast.VariableSetStmt) and opt.arg.name == "search_path":
            if scope.own_path is None:
                raise Refused(
                    "the function sets its own search_path",
                    "remove the SET search_path: pgidgen pins every shard function to its shard, pg_catalog, pg_temp",
                )
            values = scope.own_path(path_values(opt.arg))
            opt.arg.args = tuple(ast.A_Const(isnull=False, val=ast.String(sval=v)) for v in values)
            options[i] = opt
            return
    pin = ast.DefElem(
        defname="set",
        arg=ast.VariableSetStmt(
            kind=0,
            name="search_path",
            args=tuple(ast.A_Const(isnull=False, val=ast.String(sval=v)) for v in (placeholder, "pg_catalog", *scope.path_tail, "pg_temp")),
            is_local=False,
        ),
    )
    stmt.options = tuple(options) + (pin,)


def _function_body(stmt: ast.CreateFunctionStmt, placeholder: str, scope: FileScope) -> int:
    """Qualify a LANGUAGE sql body written as a string; other languages rely on the pinned search_path."""
    language = next((o.arg.sval for o in stmt.options or () if o.defname == "language"), "sql")
    inserted = 0
    for opt in stmt.options or ():
        if opt.defname != "as" or not opt.arg:
            continue
        body = opt.arg[0].sval
        if scope.rename_text is not None:
            body = scope.rename_text(body)
            opt.arg = (ast.String(sval=body),) + tuple(opt.arg[1:])
        if _BODY_SHARD_RE.search(body):
            raise Refused("its body names another shard's schema", "write names unqualified: the function's search_path is its own shard")
        if language != "sql" or len(opt.arg) != 1:
            continue
        try:
            inner = parse_sql(body)
        except ParseError:
            continue  # the server will say what is wrong; the pinned search_path still applies
        parts = []
        for raw in inner:
            if scope.rename is not None:
                scope.rename(raw.stmt)
            q = _qualify(raw.stmt, placeholder, scope, set())
            inserted += q
            parts.append(RawStream()(raw.stmt))  # type: ignore[arg-type]
        opt.arg = (ast.String(sval="; ".join(parts)),)
    return inserted


_DEFINED = {
    ObjectType.OBJECT_AGGREGATE: "aggregate",
    ObjectType.OBJECT_OPERATOR: "operator",
    ObjectType.OBJECT_TYPE: "type",
    ObjectType.OBJECT_COLLATION: "collation",
    ObjectType.OBJECT_TSDICTIONARY: "text search dictionary",
    ObjectType.OBJECT_TSCONFIGURATION: "text search configuration",
    ObjectType.OBJECT_TSPARSER: "text search parser",
    ObjectType.OBJECT_TSTEMPLATE: "text search template",
}


def _own_type(t: Any, placeholder: str, scope: FileScope) -> bool:
    parts = names(t.names) if isinstance(t, ast.TypeName) else []
    return (len(parts) == 2 and parts[0] == placeholder) or (len(parts) == 1 and parts[0] in scope.types)


def _referenced_family(fam: Any, placeholder: str) -> None:
    """An operator class's FAMILY: the shard's, or a built-in one found through the search_path; another schema's
    family would get a member once per shard."""
    parts = names(fam)
    if len(parts) > 1 and parts[0] != placeholder:
        raise refuse_schema(parts[-2], f"operator family {parts[-1]}") if forbidden(parts[-2]) else shared_target(".".join(parts))


def _more_targets(s: Any, placeholder: str, scope: FileScope, t: set[int]) -> None:
    """The objects beyond tables, types and functions that a schema holds (pg_dump writes them all)."""
    if isinstance(s, ast.DefineStmt):
        if s.kind not in _DEFINED:
            raise LookupError
        s.defnames = qualify_names(s.defnames, placeholder, base=1, thing=_DEFINED[s.kind])
    elif isinstance(s, ast.CreateOpClassStmt):
        s.opclassname = qualify_names(s.opclassname, placeholder, base=1, thing="operator class")
        if s.opfamilyname:
            _referenced_family(s.opfamilyname, placeholder)
    elif isinstance(s, (ast.CreateOpFamilyStmt, ast.AlterOpFamilyStmt)):
        s.opfamilyname = qualify_names(s.opfamilyname, placeholder, base=1, thing="operator family")
    elif isinstance(s, ast.CreateCastStmt):
        if not (_own_type(s.sourcetype, placeholder, scope) or _own_type(s.targettype, placeholder, scope)):
            raise Refused(
                "it creates a cast between types that are not the shard's: it would be created once per shard",
                "a cast between types outside the shards belongs to the database: create it once per database outside pgidgen",
            )
    elif isinstance(s, ast.RuleStmt):
        target_rangevar(s.relation, t, placeholder)
    elif isinstance(s, ast.CreateStatsStmt):
        if s.defnames:
            s.defnames = qualify_names(s.defnames, placeholder, base=1, thing="statistics")
        for rv in s.relations or ():
            target_rangevar(rv, t, placeholder)
    elif isinstance(s, ast.AlterStatsStmt):
        s.defnames = qualify_names(s.defnames, placeholder, base=1, thing="statistics")
    elif isinstance(s, ast.AlterTSConfigurationStmt):
        s.cfgname = qualify_names(s.cfgname, placeholder, base=1, thing="text search configuration")
    elif isinstance(s, ast.AlterTSDictionaryStmt):
        s.dictname = qualify_names(s.dictname, placeholder, base=1, thing="text search dictionary")
    elif isinstance(s, ast.AlterDomainStmt):
        s.typeName = qualify_names(s.typeName, placeholder, base=1, thing="domain")
    elif isinstance(s, ast.AlterOwnerStmt):
        s.object = objects_in_names(s.objectType, s.object, placeholder, "ALTER OWNER")
    elif isinstance(s, ast.AlterFunctionStmt):
        s.func = objects_in_names(s.objtype, s.func, placeholder, "ALTER FUNCTION")
    elif isinstance(s, ast.AlterDefaultPrivilegesStmt):
        schemas = next((names(o.arg) for o in s.options or () if o.defname == "schemas"), [])
        if schemas != [placeholder]:
            raise Refused("it changes default privileges outside the shard", "grant on the sharded objects by name, or run it once per database outside pgidgen")
    else:
        raise LookupError


def _grant_targets(s: ast.GrantStmt, placeholder: str, t: set[int]) -> None:
    if s.targtype != GrantTargetType.ACL_TARGET_OBJECT:
        raise Refused("it grants on all objects in a schema", "grant on the sharded tables by name: pgidgen qualifies them for every shard")
    if s.objtype in (ObjectType.OBJECT_TABLE, ObjectType.OBJECT_SEQUENCE):
        for rv in s.objects or ():
            target_rangevar(rv, t, placeholder)
    elif s.objtype in FUNC_OBJECTS:
        for o in s.objects or ():
            objects_in_names(s.objtype, o, placeholder, "GRANT")
    elif s.objtype in TYPE_OBJECTS:
        s.objects = tuple(qualify_names(o, placeholder, base=1, thing="type") for o in s.objects or ())
    elif s.objtype == ObjectType.OBJECT_SCHEMA and [getattr(o, "sval", None) for o in s.objects or ()] == [placeholder]:
        pass  # a dump's grant on its own schema, turned into the shard's (dumpfile.py)
    else:
        raise Refused("pgidgen grants on tables, sequences, functions and types only", "run other grants outside pgidgen")


def _targets(s: Any, placeholder: str, scope: FileScope) -> set[int]:
    """Check the object a statement creates or changes, and mark it; returns ids of target RangeVars."""
    t: set[int] = set()
    if isinstance(s, ast.CreateStmt):
        target_rangevar(s.relation, t, placeholder)
        for parent in s.inhRelations or ():  # INHERITS (...) and PARTITION OF: the parent is changed too
            changed_parent(parent, placeholder)
    elif isinstance(s, ast.IndexStmt):
        check_online(s)
        target_rangevar(s.relation, t, placeholder)
    elif isinstance(s, ast.ReindexStmt):
        if not concurrent(s):
            raise Refused("REINDEX without CONCURRENTLY locks the table's writes for the whole rebuild",
                          "write REINDEX INDEX CONCURRENTLY name (or REINDEX TABLE CONCURRENTLY name): pgidgen runs it shard by shard")
        check_online(s)
        target_rangevar(s.relation, t, placeholder)
    elif isinstance(s, ast.AlterTableStmt):
        target_rangevar(s.relation, t, placeholder)
        for cmd in s.cmds or ():
            sub = getattr(cmd, "subtype", None)
            if sub in (AlterTableType.AT_AddInherit, AlterTableType.AT_DropInherit):
                changed_parent(cmd.def_, placeholder)
            elif sub in (AlterTableType.AT_AttachPartition, AlterTableType.AT_DetachPartition, AlterTableType.AT_DetachPartitionFinalize):
                changed_parent(getattr(cmd.def_, "name", None), placeholder)
    elif isinstance(s, ast.ViewStmt):
        target_rangevar(s.view, t, placeholder)
    elif isinstance(s, ast.CreateTableAsStmt):
        target_rangevar(s.into.rel if s.into is not None else None, t, placeholder)
    elif isinstance(s, ast.CreateTrigStmt):
        target_rangevar(s.relation, t, placeholder)
        parts = names(s.funcname)
        if len(parts) == 1 and parts[0] in scope.functions:
            s.funcname = (ast.String(sval=placeholder), ast.String(sval=parts[0]))
        elif len(parts) > 1 and SHARD_RE.match(parts[-2]):
            raise refuse_schema(parts[-2], f"function {parts[-1]}")
    elif isinstance(s, (ast.CreateSeqStmt, ast.AlterSeqStmt)):
        target_rangevar(s.sequence, t, placeholder)
        for opt in s.options or ():
            if opt.defname == "owned_by" and opt.arg and len(opt.arg) >= 2:
                opt.arg = qualify_names(opt.arg, placeholder, base=2, thing="column")
    elif isinstance(s, ast.CompositeTypeStmt):
        target_rangevar(s.typevar, t, placeholder)
    elif isinstance(s, ast.CreatePolicyStmt):
        target_rangevar(s.table, t, placeholder)
    elif isinstance(s, ast.RenameStmt):
        if s.renameType not in _RENAMES_ON_RELATIONS or s.relation is None:
            raise Refused("pgidgen renames tables, views, indexes, sequences, columns, constraints, triggers and policies only", "run other renames outside pgidgen")
        target_rangevar(s.relation, t, placeholder)
    elif isinstance(s, ast.CreateFunctionStmt):
        parts = names(s.funcname)
        objects_in_names(ObjectType.OBJECT_FUNCTION, ast.ObjectWithArgs(objname=s.funcname), placeholder, "CREATE FUNCTION")
        s.funcname = (ast.String(sval=placeholder), ast.String(sval=parts[-1]))
    elif isinstance(s, (ast.CreateEnumStmt, ast.CreateRangeStmt, ast.AlterEnumStmt)):
        s.typeName = qualify_names(s.typeName, placeholder, base=1, thing="type")
    elif isinstance(s, ast.CreateDomainStmt):
        s.domainname = qualify_names(s.domainname, placeholder, base=1, thing="domain")
    elif isinstance(s, ast.CommentStmt):
        s.object = objects_in_names(s.objtype, s.object, placeholder, "COMMENT")
    elif isinstance(s, ast.DropStmt):
        s.objects = tuple(objects_in_names(s.removeType, o, placeholder, "DROP") for o in s.objects or ())
    elif isinstance(s, ast.GrantStmt):
        _grant_targets(s, placeholder, t)
    else:
        _more_targets(s, placeholder, scope, t)
    return t


def _qualify(s: Any, placeholder: str, scope: FileScope, targets: set[int]) -> int:
    ctes = _CteNames()
    ctes(s)
    q = _Qualifier(placeholder, scope.functions, scope.types, ctes.names, targets)
    q(s)
    return q.inserted


def check_and_rewrite(s: Any, placeholder: str, scope: FileScope) -> None:
    name = type(s).__name__
    if name in _NOT_DDL:
        raise Refused(f"it is {_NOT_DDL[name]}, not DDL", "sharded files hold schema only: write data through your application")
    if isinstance(s, ast.CreateSchemaStmt):
        raise Refused("it creates a schema", "shards are schemas pgidgen manages; write tables unqualified and pgidgen puts them into every shard")
    if isinstance(s, ast.TransactionStmt):
        raise Refused("it controls the transaction", "remove it: pgidgen runs each database in one transaction of its own")
    if isinstance(s, (ast.VariableSetStmt, ast.VariableShowStmt)):
        raise Refused("it sets a session variable", "remove it: pgidgen sets the search_path of each shard itself")
    try:
        targets = _targets(s, placeholder, scope)
    except LookupError:
        raise Refused("pgidgen does not shard this kind of statement", "run it outside pgidgen, once per database if it must be everywhere") from None
    if isinstance(s, ast.CreateFunctionStmt):
        _pin_search_path(s, placeholder, scope)
        _function_body(s, placeholder, scope)
    _qualify(s, placeholder, scope, targets)


def statement_at(source: str, name: str, number: int, raw: ast.RawStmt, placeholder: str, scope: FileScope) -> Statement:
    """One statement checked, rewritten and deparsed; a refusal names its number and position in the file."""
    start = _skip_space(source, raw.stmt_location or 0)
    line, col = line_col(source, start)
    kind = _kind(source, start)
    try:
        check_and_rewrite(raw.stmt, placeholder, scope)
        sql_text = RawStream()(raw.stmt)  # type: ignore[arg-type]
    except Refused as r:
        raise InputError(f"statement {number} ({kind}) cannot be sharded: {r.what}", where=f"{name}:{line}:{col}", hint=r.hint) from None
    except Exception as e:  # pglast cannot print some exotic nodes
        raise InputError(
            f"statement {number} ({kind}) cannot be rewritten for the shards: {type(e).__name__}: {e}",
            where=f"{name}:{line}:{col}",
            hint="simplify the statement or run it outside pgidgen",
        ) from None
    return Statement(number, line, col, kind, sql_text)


class _Strings(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []

    def visit(self, ancestors: Any, node: Any) -> None:
        for member in node:
            value = getattr(node, member)
            if isinstance(value, str):
                self.values.append(value.lower())


def choose_placeholder(source: str, raws: tuple[ast.RawStmt, ...]) -> str:
    """A schema placeholder that occurs nowhere in the file, neither in its text nor in any decoded name or string."""
    strings = _Strings()
    strings(raws)
    haystack = source.lower() + "\n" + "\n".join(strings.values)
    candidate, n = PLACEHOLDER, 0
    while candidate in haystack:
        n += 1
        candidate = f"{PLACEHOLDER}_{n}"
    return candidate


def parse_sql_file(source: str, name: str) -> tuple[ast.RawStmt, ...]:
    """The file's statements; a NUL byte or a syntax error is an error naming its position."""
    nul = source.find("\0")
    if nul >= 0:  # the parser would stop there silently, and PostgreSQL cannot store the text in the ledger
        raise InputError(f"{name} holds a NUL byte", where="{}:{}:{}".format(name, *line_col(source, nul)),
                         hint="a SQL file is text: remove the NUL byte (a file saved as UTF-16 is full of them: save it as UTF-8)")
    try:
        raws: tuple[ast.RawStmt, ...] = parse_sql(source)
    except ParseError as e:
        index = parse_error_index(source, e)
        if index is None:  # "at end of input": point just past the last statement
            index = len(source.rstrip())
        where = "{}:{}:{}".format(name, *line_col(source, index))
        raise InputError(str(e.args[0]), where=where, hint="fix the SQL; nothing was applied") from None
    if not raws:
        raise InputError(f"{name} holds no SQL statements", hint="give a file with CREATE TABLE and the like")
    return raws


def parse_file(source: str, name: str) -> ShardedFile:
    """Parse and check a whole file; the first statement pgidgen cannot shard is an error naming its position."""
    raws = parse_sql_file(source, name)
    _check_mix(source, name, raws)
    placeholder = choose_placeholder(source, raws)
    scope = collect_scope(raws)
    statements = [statement_at(source, name, number, raw, placeholder, scope) for number, raw in enumerate(raws, 1)]
    return ShardedFile(name=name, source=source, sha256=sha256(source), placeholder=placeholder, statements=tuple(statements))


def _check_mix(source: str, name: str, raws: tuple[ast.RawStmt, ...]) -> None:
    """A CONCURRENTLY statement runs outside a transaction, shard by shard: a file holding one holds nothing else
    (VALIDATE CONSTRAINT aside, which runs either way)."""
    online = next((n for n, r in enumerate(raws, 1) if concurrent(r.stmt)), None)
    other = next((n for n, r in enumerate(raws, 1) if not concurrent(r.stmt) and not validates(r.stmt)), None)
    if online is None or other is None:
        return

    def at(n: int) -> str:
        start = _skip_space(source, raws[n - 1].stmt_location or 0)
        return f"statement {n} ({_kind(source, start)}, line {line_col(source, start)[0]})"
    raise InputError(f"{name} mixes {at(online)}, which runs outside a transaction shard by shard, with {at(other)}, which runs in one",
                     hint="split the file: one with the CONCURRENTLY statements (and VALIDATE CONSTRAINT), one with the rest, applied one after the other")
