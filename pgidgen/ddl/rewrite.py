"""Where sharded DDL is rewritten: a file written once, unqualified, becomes one SQL template per shard.

pglast parses the file into statements; each statement is checked against what can be sharded safely, its
unqualified relations are qualified with a placeholder schema (and `next_id()` bound to the shard's
generator), and it is deparsed on its own. Rendering a shard is then a string replacement of the placeholder,
so 2000 shards cost 2000 replacements, not 2000 parses.

Rules, in one place:
- every unqualified relation, and every function or type the file itself creates, goes into the shard; only
  references to `pg_*` relations stay unqualified (system catalogs and views such as pg_class, pg_stat_activity:
  the shard's search_path reaches pg_catalog after the shard);
- `next_id()` is the shard's generator;
- relations qualified by the user (`public.countries`) stay as written, but may only be *referenced*: a
  statement that would create or change them would run once per shard;
- the `pgidgen` catalog's and other shards' objects are out of bounds (pgidgen's SQL functions may be called);
- functions go into the shard with `search_path` pinned to the shard, then pg_catalog, then pg_temp;
- the rendered SQL for a shard starts with `SET LOCAL search_path` to the same list, so what the file leaves
  unqualified resolves the same way in the DDL as in the functions.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pglast import ast, parse_sql
from pglast.enums import AlterTableType, GrantTargetType, ObjectType
from pglast.parser import ParseError
from pglast.stream import RawStream
from pglast.visitors import Visitor

from ..errors import InputError
from ..idgen import schema_name
from .positions import _kind, _skip_space, line_col, parse_error_index

SHARD_RE = re.compile(r"^shard_(0|[1-9][0-9]*)$")
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
#: Relation-like objects whose names are plain name lists in COMMENT ON / DROP.
_REL_OBJECTS = {
    ObjectType.OBJECT_TABLE,
    ObjectType.OBJECT_VIEW,
    ObjectType.OBJECT_MATVIEW,
    ObjectType.OBJECT_INDEX,
    ObjectType.OBJECT_SEQUENCE,
}
#: Objects named [table, name] (COMMENT ON COLUMN photos.caption, DROP TRIGGER t ON photos, ...).
_ON_TABLE_OBJECTS = {
    ObjectType.OBJECT_COLUMN,
    ObjectType.OBJECT_TABCONSTRAINT,
    ObjectType.OBJECT_TRIGGER,
    ObjectType.OBJECT_POLICY,
}
_FUNC_OBJECTS = {ObjectType.OBJECT_FUNCTION, ObjectType.OBJECT_PROCEDURE, ObjectType.OBJECT_ROUTINE}
_TYPE_OBJECTS = {ObjectType.OBJECT_TYPE, ObjectType.OBJECT_DOMAIN}
_RENAMES_ON_RELATIONS = _REL_OBJECTS | _ON_TABLE_OBJECTS | {ObjectType.OBJECT_ATTRIBUTE}


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

    @property
    def template(self) -> str:
        """The SQL for one shard with the placeholder in place of its schema (what the ledger stores)."""
        return "".join(s.template + ";\n" for s in self.statements)

    def for_shard(self, shard: int) -> str:
        return render_template(self.template, self.placeholder, shard)


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


class Refused(Exception):
    """A statement that cannot be sharded; turned into an InputError with its position by parse_file."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint


def _names(node: Any) -> list[str]:
    return [n.sval for n in node] if node else []


def _forbidden(schema: str | None) -> bool:
    return schema is not None and (schema == "pgidgen" or bool(SHARD_RE.match(schema)))


_LITERAL_SCHEMA_RE = re.compile(r'^\s*(?:"((?:[^"]|"")+)"|([^".]+))\s*\.\s*(.+)$')


def _check_relation_literal(arg: Any) -> None:
    """A relation named in a string ('shard_3.s'::regclass, nextval('pgidgen.x')) is looked up by name when the
    statement runs in each shard: a shard or catalog schema in it would tie every shard to that one object."""
    if not (isinstance(arg, ast.A_Const) and isinstance(arg.val, ast.String)):
        return
    m = _LITERAL_SCHEMA_RE.match(arg.val.sval or "")
    if m:
        schema = m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2).strip().lower()
        if _forbidden(schema):
            raise _refuse_schema(schema, f"relation {m.group(3).strip()} (in a string)")


def _check_bound_early(fn: str, arg: Any) -> None:
    """nextval('s') binds the sequence when the statement runs in each shard (a regclass constant: that shard's
    own s). Cast to text first, nextval('s'::text), it is looked up by name on every call, through the calling
    session's search_path, which does not lead into the shard: every shard would share public.s, or fail."""
    while isinstance(arg, ast.TypeCast) and arg.typeName is not None:  # 's'::text::regclass too (old SERIAL defaults)
        if _names(arg.typeName.names)[-1:] != ["regclass"]:
            raise Refused(
                f"{fn}() takes its sequence's name as {'.'.join(_names(arg.typeName.names))}, looked up on every call through the caller's search_path, not in the shard",
                f"write {fn}('name') with the name as a plain string (or ::regclass): each shard then uses its own sequence",
            )
        arg = arg.arg


def _refuse_schema(schema: str, thing: str) -> Refused:
    if schema == "pgidgen":
        return Refused(f"it names {thing} in pgidgen's catalog schema", "the catalog is pgidgen's own; leave it out of sharded files")
    return Refused(
        f"it names {thing} in shard schema {schema}",
        "write names unqualified (and next_id() without a schema): pgidgen puts them into every shard itself",
    )


def _shared_target(qualified: str) -> Refused:
    return Refused(
        f"it would change {qualified} once per shard",
        "a sharded file creates and changes objects inside the shards only; objects qualified with a schema may be referenced, "
        "not created or changed: manage them outside pgidgen",
    )


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
            if _forbidden(node.schemaname):
                raise _refuse_schema(node.schemaname, f"relation {node.relname}")
            return
        if node.relpersistence == "t":
            raise Refused("it creates a temporary table", "temporary tables are per session, not per shard: leave them out of sharded files")
        if id(node) not in self.targets and (node.relname in self.ctes or (node.relname or "").startswith("pg_")):
            return  # a CTE, or a system catalog or view: the shard's search_path finds a shard's own pg_* name first
        node.schemaname = self.placeholder
        self.inserted += 1

    def visit_FuncCall(self, ancestors: Any, node: ast.FuncCall) -> None:
        names = _names(node.funcname)
        if names[-1] in ("nextval", "currval", "setval") and names[:-1] in ([], ["pg_catalog"]) and node.args:
            _check_relation_literal(node.args[0])
            _check_bound_early(names[-1], node.args[0])
        if len(names) == 1:
            if (names[0] == "next_id" and not node.args) or names[0] in self.functions:
                node.funcname = (self._p(), ast.String(sval=names[0]))
        elif len(names) >= 2 and SHARD_RE.match(names[-2]):
            raise _refuse_schema(names[-2], f"function {names[-1]}()")

    def visit_TypeCast(self, ancestors: Any, node: ast.TypeCast) -> None:
        if node.typeName is not None and _names(node.typeName.names)[-1:] == ["regclass"]:
            _check_relation_literal(node.arg)

    def visit_TypeName(self, ancestors: Any, node: ast.TypeName) -> None:
        names = _names(node.names)
        if len(names) == 1 and names[0] in self.types:
            node.names = (self._p(), ast.String(sval=names[0]))
        elif len(names) >= 2 and _forbidden(names[-2]):
            raise _refuse_schema(names[-2], f"type {names[-1]}")

    def visit_ObjectWithArgs(self, ancestors: Any, node: ast.ObjectWithArgs) -> None:
        # functions named in COMMENT/DROP/GRANT are the shard's own; their targets were checked already
        names = _names(node.objname)
        if len(names) == 1:
            node.objname = (self._p(), ast.String(sval=names[0]))


class _CteNames(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_CommonTableExpr(self, ancestors: Any, node: ast.CommonTableExpr) -> None:
        if node.ctename:
            self.names.add(node.ctename)


def _qualify_names(names: tuple[ast.String, ...] | None, placeholder: str, *, base: int, thing: str) -> tuple[ast.String, ...]:
    """A name list whose last `base` items name the object within its schema: prefix the shard's schema."""
    parts = _names(names)
    if len(parts) > base:
        schema = parts[-base - 1]
        if _forbidden(schema):
            raise _refuse_schema(schema, f"{thing} {'.'.join(parts[-base:])}")
        raise _shared_target(".".join(parts))
    return (ast.String(sval=placeholder),) + tuple(ast.String(sval=p) for p in parts)


def _target_rangevar(rv: ast.RangeVar | None, targets: set[int]) -> None:
    if rv is None:
        return
    if rv.schemaname is not None:
        if _forbidden(rv.schemaname):
            raise _refuse_schema(rv.schemaname, f"relation {rv.relname}")
        raise _shared_target(f"{rv.schemaname}.{rv.relname}")
    targets.add(id(rv))


def _changed_parent(rv: Any) -> None:
    """A table a statement attaches to or detaches from another (INHERITS, PARTITION OF, INHERIT, ATTACH
    PARTITION): both change, so a qualified one is a shared object changed once per shard."""
    if isinstance(rv, ast.RangeVar) and rv.schemaname is not None:
        if _forbidden(rv.schemaname):
            raise _refuse_schema(rv.schemaname, f"relation {rv.relname}")
        raise _shared_target(f"{rv.schemaname}.{rv.relname}")


def _objects_in_names(objtype: ObjectType | None, obj: Any, placeholder: str, what: str) -> Any:
    """COMMENT ON / DROP targets: qualify the object's name with the shard's schema, by object type."""
    if objtype in _REL_OBJECTS:
        return _qualify_names(obj, placeholder, base=1, thing=what)
    if objtype in _ON_TABLE_OBJECTS:
        return _qualify_names(obj, placeholder, base=2, thing=what)
    if objtype in _FUNC_OBJECTS:
        parts = _names(obj.objname)
        if len(parts) > 1:
            raise _refuse_schema(parts[-2], "function " + parts[-1]) if _forbidden(parts[-2]) else _shared_target(".".join(parts))
        return obj  # the visitor qualifies it
    if objtype in _TYPE_OBJECTS:
        parts = _names(obj.names)
        if len(parts) > 1:
            raise _refuse_schema(parts[-2], "type " + parts[-1]) if _forbidden(parts[-2]) else _shared_target(".".join(parts))
        obj.names = (ast.String(sval=placeholder), ast.String(sval=parts[0]))
        return obj
    if objtype == ObjectType.OBJECT_SCHEMA:
        raise Refused("it names a schema", "shards are schemas pgidgen manages; write tables unqualified and pgidgen puts them into every shard")
    kind = objtype.name[7:].lower().replace("_", " ") if objtype is not None else "these"
    raise Refused(f"pgidgen does not shard {what} on {kind} objects", "run it outside pgidgen")


@dataclass
class _FileScope:
    functions: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)


def _collect_scope(stmts: Iterable[ast.RawStmt]) -> _FileScope:
    scope = _FileScope()
    for raw in stmts:
        s = raw.stmt
        if isinstance(s, ast.CreateFunctionStmt):
            names = _names(s.funcname)
            if len(names) == 1:
                scope.functions.add(names[0])
        elif isinstance(s, ast.CreateEnumStmt) or isinstance(s, ast.CreateDomainStmt):
            names = _names(s.typeName if isinstance(s, ast.CreateEnumStmt) else s.domainname)
            if len(names) == 1:
                scope.types.add(names[0])
        elif isinstance(s, ast.CompositeTypeStmt) and s.typevar is not None and s.typevar.schemaname is None:
            scope.types.add(str(s.typevar.relname))
        elif isinstance(s, ast.CreateRangeStmt):
            names = _names(s.typeName)
            if len(names) == 1:
                scope.types.add(names[0])
    return scope


def _pin_search_path(stmt: ast.CreateFunctionStmt, placeholder: str) -> None:
    options = list(stmt.options or ())
    for opt in options:
        if opt.defname == "set" and isinstance(opt.arg, ast.VariableSetStmt) and opt.arg.name == "search_path":
            raise Refused(
                "the function sets its own search_path",
                "remove the SET search_path: pgidgen pins every shard function to its shard, pg_catalog, pg_temp",
            )
    pin = ast.DefElem(
        defname="set",
        arg=ast.VariableSetStmt(
            kind=0,
            name="search_path",
            args=tuple(ast.A_Const(isnull=False, val=ast.String(sval=v)) for v in (placeholder, "pg_catalog", "pg_temp")),
            is_local=False,
        ),
    )
    stmt.options = tuple(options) + (pin,)


def _function_body(stmt: ast.CreateFunctionStmt, placeholder: str, scope: _FileScope) -> int:
    """Qualify a LANGUAGE sql body written as a string; other languages rely on the pinned search_path."""
    language = next((o.arg.sval for o in stmt.options or () if o.defname == "language"), "sql")
    inserted = 0
    for opt in stmt.options or ():
        if opt.defname != "as" or not opt.arg:
            continue
        body = opt.arg[0].sval
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
            q = _qualify(raw.stmt, placeholder, scope, set())
            inserted += q
            parts.append(RawStream()(raw.stmt))  # type: ignore[arg-type]
        opt.arg = (ast.String(sval="; ".join(parts)),)
    return inserted


def _targets(s: Any, placeholder: str, scope: _FileScope) -> set[int]:
    """Check the object a statement creates or changes, and mark it; returns ids of target RangeVars."""
    t: set[int] = set()
    if isinstance(s, ast.CreateStmt):
        _target_rangevar(s.relation, t)
        for parent in s.inhRelations or ():  # INHERITS (...) and PARTITION OF: the parent is changed too
            _changed_parent(parent)
    elif isinstance(s, ast.IndexStmt):
        if s.concurrent:
            raise Refused(
                "CREATE INDEX CONCURRENTLY cannot run inside a transaction, and pgidgen applies each database in one",
                "drop CONCURRENTLY (on new or small tables a plain CREATE INDEX is quick); to build an index on large live tables, "
                "run CREATE INDEX CONCURRENTLY per shard outside pgidgen",
            )
        _target_rangevar(s.relation, t)
    elif isinstance(s, ast.AlterTableStmt):
        _target_rangevar(s.relation, t)
        for cmd in s.cmds or ():
            sub = getattr(cmd, "subtype", None)
            if sub in (AlterTableType.AT_AddInherit, AlterTableType.AT_DropInherit):
                _changed_parent(cmd.def_)
            elif sub in (AlterTableType.AT_AttachPartition, AlterTableType.AT_DetachPartition, AlterTableType.AT_DetachPartitionFinalize):
                _changed_parent(getattr(cmd.def_, "name", None))
    elif isinstance(s, ast.ViewStmt):
        _target_rangevar(s.view, t)
    elif isinstance(s, ast.CreateTableAsStmt):
        _target_rangevar(s.into.rel if s.into is not None else None, t)
    elif isinstance(s, ast.CreateTrigStmt):
        _target_rangevar(s.relation, t)
        names = _names(s.funcname)
        if len(names) == 1 and names[0] in scope.functions:
            s.funcname = (ast.String(sval=placeholder), ast.String(sval=names[0]))
        elif len(names) > 1 and SHARD_RE.match(names[-2]):
            raise _refuse_schema(names[-2], f"function {names[-1]}")
    elif isinstance(s, (ast.CreateSeqStmt, ast.AlterSeqStmt)):
        _target_rangevar(s.sequence, t)
        for opt in s.options or ():
            if opt.defname == "owned_by" and opt.arg and len(opt.arg) == 2:
                opt.arg = _qualify_names(opt.arg, placeholder, base=2, thing="column")
    elif isinstance(s, ast.CompositeTypeStmt):
        _target_rangevar(s.typevar, t)
    elif isinstance(s, ast.CreatePolicyStmt):
        _target_rangevar(s.table, t)
    elif isinstance(s, ast.RenameStmt):
        if s.renameType not in _RENAMES_ON_RELATIONS or s.relation is None:
            raise Refused("pgidgen renames tables, views, indexes, sequences, columns, constraints, triggers and policies only", "run other renames outside pgidgen")
        _target_rangevar(s.relation, t)
    elif isinstance(s, ast.CreateFunctionStmt):
        names = _names(s.funcname)
        if len(names) > 1:
            raise _refuse_schema(names[-2], f"function {names[-1]}") if _forbidden(names[-2]) else _shared_target(".".join(names))
        s.funcname = (ast.String(sval=placeholder), ast.String(sval=names[0]))
    elif isinstance(s, ast.CreateEnumStmt):
        s.typeName = _qualify_names(s.typeName, placeholder, base=1, thing="type")
    elif isinstance(s, ast.CreateRangeStmt):
        s.typeName = _qualify_names(s.typeName, placeholder, base=1, thing="type")
    elif isinstance(s, ast.CreateDomainStmt):
        s.domainname = _qualify_names(s.domainname, placeholder, base=1, thing="domain")
    elif isinstance(s, ast.AlterEnumStmt):
        s.typeName = _qualify_names(s.typeName, placeholder, base=1, thing="type")
    elif isinstance(s, ast.CommentStmt):
        s.object = _objects_in_names(s.objtype, s.object, placeholder, "COMMENT")
    elif isinstance(s, ast.DropStmt):
        if s.concurrent:
            raise Refused("DROP INDEX CONCURRENTLY cannot run inside a transaction, and pgidgen applies each database in one", "drop CONCURRENTLY")
        s.objects = tuple(_objects_in_names(s.removeType, o, placeholder, "DROP") for o in s.objects or ())
    elif isinstance(s, ast.GrantStmt):
        if s.targtype != GrantTargetType.ACL_TARGET_OBJECT:
            raise Refused("it grants on all objects in a schema", "grant on the sharded tables by name: pgidgen qualifies them for every shard")
        if s.objtype in (ObjectType.OBJECT_TABLE, ObjectType.OBJECT_SEQUENCE):
            for rv in s.objects or ():
                _target_rangevar(rv, t)
        elif s.objtype in _FUNC_OBJECTS:
            for o in s.objects or ():
                _objects_in_names(s.objtype, o, placeholder, "GRANT")
        else:
            raise Refused("pgidgen grants on tables, sequences and functions only", "run other grants outside pgidgen")
    else:
        raise LookupError
    return t


def _qualify(s: Any, placeholder: str, scope: _FileScope, targets: set[int]) -> int:
    ctes = _CteNames()
    ctes(s)
    q = _Qualifier(placeholder, scope.functions, scope.types, ctes.names, targets)
    q(s)
    return q.inserted


def _check_and_rewrite(s: Any, placeholder: str, scope: _FileScope) -> None:
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
        _pin_search_path(s, placeholder)
        _function_body(s, placeholder, scope)
    _qualify(s, placeholder, scope, targets)


class _Strings(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []

    def visit(self, ancestors: Any, node: Any) -> None:
        for member in node:
            value = getattr(node, member)
            if isinstance(value, str):
                self.values.append(value.lower())


def _choose_placeholder(source: str, raws: tuple[ast.RawStmt, ...]) -> str:
    """A schema placeholder that occurs nowhere in the file, neither in its text nor in any decoded name or string."""
    strings = _Strings()
    strings(raws)
    haystack = source.lower() + "\n" + "\n".join(strings.values)
    candidate, n = PLACEHOLDER, 0
    while candidate in haystack:
        n += 1
        candidate = f"{PLACEHOLDER}_{n}"
    return candidate


def parse_file(source: str, name: str) -> ShardedFile:
    """Parse and check a whole file; the first statement pgidgen cannot shard is an error naming its position."""
    nul = source.find("\0")
    if nul >= 0:  # the parser would stop there silently, and PostgreSQL cannot store the text in the ledger
        raise InputError(f"{name} holds a NUL byte", where="{}:{}:{}".format(name, *line_col(source, nul)),
                         hint="a SQL file is text: remove the NUL byte (a file saved as UTF-16 is full of them: save it as UTF-8)")
    try:
        raws = parse_sql(source)
    except ParseError as e:
        index = parse_error_index(source, e)
        if index is None:  # "at end of input": point just past the last statement
            index = len(source.rstrip())
        where = "{}:{}:{}".format(name, *line_col(source, index))
        raise InputError(str(e.args[0]), where=where, hint="fix the SQL; nothing was applied") from None
    if not raws:
        raise InputError(f"{name} holds no SQL statements", hint="give a file with CREATE TABLE and the like")
    placeholder = _choose_placeholder(source, raws)
    scope = _collect_scope(raws)
    statements: list[Statement] = []
    for number, raw in enumerate(raws, 1):
        start = _skip_space(source, raw.stmt_location or 0)
        line, col = line_col(source, start)
        kind = _kind(source, start)
        try:
            _check_and_rewrite(raw.stmt, placeholder, scope)
            sql_text = RawStream()(raw.stmt)  # type: ignore[arg-type]
        except Refused as r:
            raise InputError(f"statement {number} ({kind}) cannot be sharded: {r.what}", where=f"{name}:{line}:{col}", hint=r.hint) from None
        except Exception as e:  # pglast cannot print some exotic nodes
            raise InputError(
                f"statement {number} ({kind}) cannot be rewritten for the shards: {type(e).__name__}: {e}",
                where=f"{name}:{line}:{col}",
                hint="simplify the statement or run it outside pgidgen",
            ) from None
        statements.append(Statement(number, line, col, kind, sql_text))
    return ShardedFile(name=name, source=source, sha256=sha256(source), placeholder=placeholder, statements=tuple(statements))
