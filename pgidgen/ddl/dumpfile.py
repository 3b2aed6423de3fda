"""`apply-ddl --from-schema SCHEMA`: a schema dump taken byte for byte, SCHEMA's objects made the shard's.

A dump (pg_dump --schema-only, plain format, of PostgreSQL 12-18; Rails' structure.sql, which is the same) is
one database's schema with every name qualified: pg_dump empties the search_path first. Each statement is
- taken: a name `SCHEMA.x` of an object the file creates becomes the shard's (the placeholder's), in the
  statement, in a LANGUAGE sql body, and as text in other languages' bodies; names it does not create (an
  extension's types, operator classes and functions: `public.citext`, `public.gin_trgm_ops`) stay as written;
  then the statement goes through the rules every sharded file does (rewrite.py);
- turned into something else: `SET check_function_bodies = false` (and settings that change what the statements
  make: default_tablespace, default_table_access_method) into SET LOCAL while the shard's statements run, reset
  after; CREATE EXTENSION into IF NOT EXISTS, checked in every database before anything runs (extensions.py);
  a function's own `SET search_path` naming SCHEMA into the shard's; grants on SCHEMA itself into grants on the
  shard's schema; OWNER TO into --owner's role when given;
- left out, and said why: the session's settings, the search_path reset, OWNER TO (without --owner), what
  belongs to SCHEMA itself (CREATE SCHEMA, its owner and comment), the extensions' comments, psql's `\\restrict`
  lines, pg_dump --clean's drops, large objects, pgidgen's own objects (in a dump of a shard), and Rails'
  schema_migrations rows: recorded once, in the ledger's copy of the file, not in every shard.
A dump of pg_dump before 10.3 leaves names unqualified after `SET search_path = public, pg_catalog`: that SET is
turned into the shard's search_path, and the unqualified names go into the shard as in any sharded file.
Whatever else cannot live in a shard is refused before anything runs, with file:line, as in any sharded file.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pglast import ast
from pglast.enums import AlterTableType, ConstrType, ObjectType
from pglast.stream import RawStream
from pglast.visitors import Visitor

from ..errors import InputError
from .names import Refused, literal_schema, names
from .positions import _kind, _skip_space, line_col
from .rewrite import FileScope, ShardedFile, Statement, choose_placeholder, collect_scope, parse_sql_file, path_values, sha256, statement_at

#: What init makes in every shard; a dump of a shard holds them, and leaves them out.
PGIDGEN_OWN = {"next_id", "pgidgen_locked_next_id", "pgidgen_counter", "pgidgen_offset"}
#: Settings that change what the statements make: kept, as SET LOCAL for the shard's statements, unless default.
_KEPT_SETTINGS = {"check_function_bodies": "true", "default_tablespace": "", "default_table_access_method": "heap"}
_RAILS = "INSERT INTO schema_migrations"
_SEARCH_PATH = "SET search_path naming the schema into SET LOCAL search_path naming the shard"
_KINDS = ("rel", "type", "func", "op", "opclass", "coll", "ts", "stat")
_REG = {"regclass": ("rel",), "regtype": ("type", "rel"), "regproc": ("func",), "regprocedure": ("func",), "regoper": ("op",),
        "regoperator": ("op",), "regconfig": ("ts",), "regdictionary": ("ts",), "regcollation": ("coll",)}
#: Options of CREATE AGGREGATE / OPERATOR / TYPE / TEXT SEARCH ... that name a function (written as a type name).
_FUNC_OPTIONS = {"sfunc", "finalfunc", "combinefunc", "serialfunc", "deserialfunc", "msfunc", "minvfunc", "mfinalfunc", "function",
                 "procedure", "restrict", "join", "subtype_diff", "canonical", "input", "output", "receive", "send", "typmod_in",
                 "typmod_out", "analyze", "subscript", "start", "gettoken", "end", "lextypes", "headline", "init", "lexize"}
_DEFINED = {ObjectType.OBJECT_AGGREGATE: "func", ObjectType.OBJECT_OPERATOR: "op", ObjectType.OBJECT_TYPE: "type",
            ObjectType.OBJECT_COLLATION: "coll", ObjectType.OBJECT_TSDICTIONARY: "ts", ObjectType.OBJECT_TSCONFIGURATION: "ts",
            ObjectType.OBJECT_TSPARSER: "ts", ObjectType.OBJECT_TSTEMPLATE: "ts"}
_META_RE = re.compile(r"^\\(?:restrict|unrestrict)[ \t]+\S+[ \t]*$", re.M)
_OTHER_META_RE = re.compile(r"^\\[A-Za-z]", re.M)
_INDEXED = (ConstrType.CONSTR_PRIMARY, ConstrType.CONSTR_UNIQUE, ConstrType.CONSTR_EXCLUSION)
_NOUNS = {"CreateStmt": "tables", "ViewStmt": "views", "CreateTableAsStmt": "materialized views", "IndexStmt": "indexes",
          "CreateSeqStmt": "sequences", "CreateTrigStmt": "triggers", "CreateEnumStmt": "types", "CompositeTypeStmt": "types",
          "CreateRangeStmt": "types", "CreateDomainStmt": "domains", "CreatePolicyStmt": "policies", "RuleStmt": "rules",
          "CreateStatsStmt": "statistics", "CreateOpClassStmt": "operator classes", "CreateOpFamilyStmt": "operator families",
          "CreateCastStmt": "casts", "CommentStmt": "comments", "GrantStmt": "grants"}
_DEFINE_NOUNS = {ObjectType.OBJECT_AGGREGATE: "aggregates", ObjectType.OBJECT_OPERATOR: "operators", ObjectType.OBJECT_TYPE: "types",
                 ObjectType.OBJECT_COLLATION: "collations"}


def created_names(raws: tuple[ast.RawStmt, ...], schema: str) -> dict[str, set[str]]:
    """The names the file creates in SCHEMA, by kind of name (relations, types, functions, operators, ...)."""
    made: dict[str, set[str]] = {k: set() for k in _KINDS}

    def add(parts: list[str], *kinds: str) -> None:
        if len(parts) == 2 and parts[0] == schema:
            for k in kinds:
                made[k].add(parts[1])

    def rel(rv: Any, *kinds: str) -> None:
        if isinstance(rv, ast.RangeVar):
            add([rv.schemaname or "", rv.relname or ""], *kinds)

    for raw in raws:
        s = raw.stmt
        if isinstance(s, (ast.CreateStmt, ast.ViewStmt, ast.CreateSeqStmt, ast.CompositeTypeStmt)):
            rv = s.relation if isinstance(s, ast.CreateStmt) else s.view if isinstance(s, ast.ViewStmt) else \
                s.sequence if isinstance(s, ast.CreateSeqStmt) else s.typevar
            rel(rv, "rel", "type")
            if isinstance(s, ast.CreateStmt) and isinstance(rv, ast.RangeVar):
                for c in s.constraints or ():  # PRIMARY KEY, UNIQUE, EXCLUDE make an index of the constraint's name
                    if c.contype in _INDEXED and c.conname:
                        add([rv.schemaname or "", c.conname], "rel")
        elif isinstance(s, ast.CreateTableAsStmt) and s.into is not None:
            rel(s.into.rel, "rel", "type")
        elif isinstance(s, ast.IndexStmt) and s.idxname and s.relation is not None:
            add([s.relation.schemaname or "", s.idxname], "rel")
        elif isinstance(s, ast.AlterTableStmt) and s.relation is not None:
            for cmd in s.cmds or ():
                c = getattr(cmd, "def_", None)
                if getattr(cmd, "subtype", None) == AlterTableType.AT_AddConstraint and isinstance(c, ast.Constraint) \
                        and c.contype in _INDEXED and c.conname:
                    add([s.relation.schemaname or "", c.conname], "rel")
        elif isinstance(s, (ast.CreateEnumStmt, ast.CreateRangeStmt)):
            parts = names(s.typeName)
            add(parts, "type")
            if isinstance(s, ast.CreateRangeStmt) and len(parts) == 2:
                multi = next((o.arg for o in s.params or () if o.defname == "multirange_type_name"), None)
                if isinstance(multi, ast.TypeName):
                    add(names(multi.names), "type")
                else:
                    add([parts[0], parts[1].replace("range", "multirange", 1) if "range" in parts[1] else parts[1] + "_multirange"], "type")
        elif isinstance(s, ast.CreateDomainStmt):
            add(names(s.domainname), "type")
        elif isinstance(s, ast.DefineStmt) and s.kind in _DEFINED:
            add(names(s.defnames), _DEFINED[s.kind])
        elif isinstance(s, ast.CreateFunctionStmt):
            add(names(s.funcname), "func")
        elif isinstance(s, ast.CreateOpClassStmt):
            add(names(s.opclassname), "opclass")
            add(names(s.opfamilyname) or names(s.opclassname), "opclass")
        elif isinstance(s, ast.CreateOpFamilyStmt):
            add(names(s.opfamilyname), "opclass")
        elif isinstance(s, ast.CreateStatsStmt):
            add(names(s.defnames), "stat")
    seqs = _SequenceNames()
    seqs(raws)
    for parts in seqs.found:  # identity columns' sequences: ALTER TABLE ... ADD GENERATED ... (SEQUENCE NAME s.x)
        add(parts, "rel")
    return made


class _SequenceNames(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[list[str]] = []

    def visit_DefElem(self, ancestors: Any, node: ast.DefElem) -> None:
        if node.defname == "sequence_name" and isinstance(node.arg, tuple):
            self.found.append(names(node.arg))


class Renamer(Visitor):
    """SCHEMA.x becomes placeholder.x wherever x is an object of that kind the file creates."""

    def __init__(self, schema: str, placeholder: str, made: dict[str, set[str]]) -> None:
        super().__init__()
        self.schema = schema
        self.placeholder = placeholder
        self.made = made
        self.every = set().union(*made.values())

    def _in(self, name: str, kinds: tuple[str, ...] | None) -> bool:
        return name in self.every if kinds is None else any(name in self.made[k] for k in kinds)

    def _names(self, parts: tuple[Any, ...], kinds: tuple[str, ...] | None) -> tuple[Any, ...] | None:
        items = [getattr(p, "sval", None) for p in parts]
        if len(items) >= 2 and items[0] == self.schema and self._in(str(items[1]), kinds):
            return (ast.String(sval=self.placeholder),) + parts[1:]
        if len(items) >= 3 and items[1] == self.schema and str(items[2]) in self.made["opclass"]:  # [method, schema, name]
            return parts[:1] + (ast.String(sval=self.placeholder),) + parts[2:]
        return None

    def _fix(self, value: tuple[Any, ...], kinds: tuple[str, ...] | None) -> tuple[Any, ...] | None:
        if value and all(isinstance(p, ast.String) for p in value):
            return self._names(value, kinds)
        if not any(isinstance(p, tuple) for p in value):
            return None
        fixed = [self._fix(p, kinds) if isinstance(p, tuple) else None for p in value]
        return tuple(f if f is not None else p for p, f in zip(value, fixed, strict=True)) if any(f is not None for f in fixed) else None

    def literal(self, const: Any, kinds: tuple[str, ...]) -> None:
        """A name in a string: nextval('public.x_seq'::regclass), 'public.task_search'::regconfig."""
        if not (isinstance(const, ast.A_Const) and isinstance(const.val, ast.String)):
            return
        found = literal_schema(const.val.sval or "")
        if found and found[0] == self.schema:
            rest = found[1]
            name = rest[1:rest.index('"', 1)].replace('""', '"') if rest.startswith('"') and '"' in rest[1:] else re.split(r"[^\w$]", rest)[0].lower()
            if self._in(name, kinds):
                const.val = ast.String(sval=f"{self.placeholder}.{rest}")

    def visit(self, ancestors: Any, node: Any) -> None:
        if isinstance(node, ast.RangeVar):
            if node.schemaname == self.schema and node.relname in self.made["rel"]:
                node.schemaname = self.placeholder
            return
        if isinstance(node, ast.TypeCast) and node.typeName is not None:
            reg = _REG.get((names(node.typeName.names) or [""])[-1])
            if reg:
                self.literal(node.arg, reg)
        elif isinstance(node, ast.FuncCall) and names(node.funcname)[-1:] in (["nextval"], ["currval"], ["setval"]) and node.args:
            self.literal(node.args[0], ("rel",))
        elif isinstance(node, ast.DefElem) and isinstance(node.arg, ast.TypeName) and node.defname in _FUNC_OPTIONS:
            fixed = self._names(node.arg.names or (), ("func",))
            if fixed is not None:
                node.arg.names = fixed
        for member in node:
            value = getattr(node, member)
            if isinstance(value, tuple):
                fixed = self._fix(value, _kinds_of(node, member))
                if fixed is not None:
                    setattr(node, member, fixed)


def _kinds_of(node: Any, member: str) -> tuple[str, ...] | None:
    """Which kinds of object a name list of this node names (None: any the file creates)."""
    if isinstance(node, ast.TypeName):
        return ("type", "rel")
    if isinstance(node, ast.FuncCall):
        return ("func",)
    if isinstance(node, ast.ObjectWithArgs):
        return ("func", "op")
    if isinstance(node, ast.A_Expr) or (isinstance(node, ast.DefElem) and node.defname in ("commutator", "negator", "sortop")):
        return ("op",)
    if isinstance(node, ast.ColumnRef):
        return ("rel",) if len(node.fields or ()) >= 3 else ("-",)
    if isinstance(node, ast.CollateClause) or (isinstance(node, ast.IndexElem) and member == "collation"):
        return ("coll",)
    if isinstance(node, ast.IndexElem) and member == "opclass":
        return ("opclass",)
    if isinstance(node, ast.Constraint) and member == "exclusions":
        return ("op",)
    return None


def body_renamer(schema: str, placeholder: str, made: dict[str, set[str]]) -> Any:
    """SCHEMA.x as text in a function body of another language than SQL (PL/pgSQL): the names the file creates."""
    every = set().union(*made.values())
    alts = [re.escape('"' + schema.replace('"', '""') + '"')]
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", schema):
        alts.append("(?i:" + re.escape(schema) + ")")
    rx = re.compile(r'(?<![\w$."])(?:' + "|".join(alts) + r')(\s*\.\s*)("(?:[^"]|"")+"|[A-Za-z_][\w$]*)')

    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        key = name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()
        return placeholder + m.group(1) + name if key in every else m.group(0)

    return lambda text: rx.sub(one, text)


class _Reading:
    """One dump being read: the counts for the summary, the statements kept, the settings to reset."""

    def __init__(self, source: str, name: str, schema: str, owner: str | None) -> None:
        self.source, self.name, self.schema, self.owner = source, name, schema, owner
        self.taken: Counter[str] = Counter()
        self.turned: Counter[str] = Counter()
        self.left_out: Counter[str] = Counter()
        self.owner_seen = 0
        self.versions = 0
        self.settings: dict[str, int] = {}
        self.extensions: list[tuple[str, str]] = []
        self.own_path: Any = None
        self.schemas_made: dict[str, str] = {}

    def as_is(self, number: int, raw: ast.RawStmt, sql_text: str) -> Statement:
        start = _skip_space(self.source, raw.stmt_location or 0)
        line, col = line_col(self.source, start)
        return Statement(number, line, col, _kind(self.source, start), sql_text)

    def refused(self, number: int, raw: ast.RawStmt, r: Refused) -> InputError:
        st = self.as_is(number, raw, "")
        return InputError(f"statement {number} ({st.kind}) cannot be sharded: {r.what}", where=f"{self.name}:{st.line}:{st.column}", hint=r.hint)


def _setting(s: Any) -> tuple[str, str] | None:
    """(name, value) of SET name = value, RESET (value None as ''), or SELECT pg_catalog.set_config('name', 'value', false)."""
    if isinstance(s, ast.VariableSetStmt):
        value = ",".join(str(getattr(getattr(a, "val", None), "sval", None) or getattr(getattr(a, "val", None), "ival", "")) for a in s.args or ())
        return (s.name or "all").lower(), value
    if isinstance(s, ast.SelectStmt) and s.targetList and len(s.targetList) == 1 and not s.fromClause:
        f = s.targetList[0].val
        if isinstance(f, ast.FuncCall) and names(f.funcname)[-1:] == ["set_config"] and len(f.args or ()) == 3:
            vals = [getattr(getattr(a, "val", None), "sval", None) for a in (f.args or ())[:2]]
            if all(isinstance(v, str) for v in vals):
                return str(vals[0]).lower(), str(vals[1])
    return None


def _off(value: str) -> str:
    v = value.strip().strip("'").lower()
    return {"false": "false", "off": "false", "0": "false", "no": "false", "on": "true", "true": "true", "1": "true", "yes": "true"}.get(v, v)


def _pgidgen_own(s: Any, placeholder: str) -> bool:
    """A statement about one of init's objects in a dumped shard (after renaming, so qualified with the placeholder)."""
    def own(parts: list[str]) -> bool:
        return len(parts) == 2 and parts[0] == placeholder and parts[1] in PGIDGEN_OWN

    if isinstance(s, (ast.CreateSeqStmt, ast.AlterSeqStmt)) and s.sequence is not None:
        return own([s.sequence.schemaname or "", s.sequence.relname or ""])
    if isinstance(s, ast.AlterTableStmt) and s.relation is not None:
        return own([s.relation.schemaname or "", s.relation.relname or ""])
    if isinstance(s, ast.CreateFunctionStmt):
        return own(names(s.funcname))
    obj = s.object if isinstance(s, (ast.CommentStmt, ast.AlterOwnerStmt)) else None
    if isinstance(obj, ast.ObjectWithArgs):
        return own(names(obj.objname))
    if isinstance(s, ast.GrantStmt) and s.objects:
        first = s.objects[0]
        parts = [first.schemaname or "", first.relname or ""] if isinstance(first, ast.RangeVar) else \
            names(first.objname) if isinstance(first, ast.ObjectWithArgs) else []
        return own(parts)
    return False


def _owner_statement(s: Any) -> Any:
    """The RoleSpec holder of an OWNER TO statement, else None."""
    if isinstance(s, ast.AlterOwnerStmt):
        return s
    if isinstance(s, ast.AlterTableStmt) and s.cmds and len(s.cmds) == 1 and s.cmds[0].subtype == AlterTableType.AT_ChangeOwner:
        return s.cmds[0]
    return None


def _rails_versions(s: Any, schema: str) -> int | None:
    if isinstance(s, ast.InsertStmt) and s.relation is not None and s.relation.relname == "schema_migrations" \
            and s.relation.schemaname in (None, schema) and isinstance(s.selectStmt, ast.SelectStmt):
        return len(s.selectStmt.valuesLists or ())
    return None


def _extension_schemas(raws: tuple[ast.RawStmt, ...]) -> list[str]:
    out: list[str] = []
    for raw in raws:
        if isinstance(raw.stmt, ast.CreateExtensionStmt):
            schema = next((getattr(o.arg, "sval", None) for o in raw.stmt.options or () if o.defname == "schema"), None)
            if schema and schema != "pg_catalog" and schema not in out:
                out.append(schema)
    return out


def parse_dump(source: str, name: str, schema: str, *, owner: str | None = None) -> ShardedFile:
    """Read a schema dump whose objects live in `schema`: every statement taken for the shards, turned into what
    it means for them, or left out with the reason (ShardedFile.summary); refused otherwise, naming file:line."""
    if not schema or schema == "pgidgen":
        raise InputError(f"--from-schema {schema!r} names no schema of an application",
                         hint="give the schema the dump's tables live in, e.g. public (a shard's, shard_N, for a dump of one shard)")
    text, restricts = _META_RE.subn(lambda m: " " * len(m.group(0)), source)
    meta = _OTHER_META_RE.search(text)
    if meta is not None:
        raise InputError(f"{name} holds a psql meta-command ({text[meta.start():text.find(chr(10), meta.start())].strip()[:40]})",
                         where="{}:{}:{}".format(name, *line_col(text, meta.start())),
                         hint="give a plain-format dump of one database's schema: pg_dump --schema-only, without --create")
    raws = parse_sql_file(text, name)
    placeholder = choose_placeholder(source, raws)
    made = created_names(raws, schema)
    unqualified = any(isinstance(raw.stmt, ast.CreateStmt) and raw.stmt.relation is not None and not raw.stmt.relation.schemaname for raw in raws)
    if not any(made.values()) and not unqualified:  # (pg_dump before 10.3 left names unqualified: they are the shard's)
        elsewhere = sorted({str(raw.stmt.relation.schemaname) for raw in raws if isinstance(raw.stmt, ast.CreateStmt)
                            and raw.stmt.relation is not None and raw.stmt.relation.schemaname})
        raise InputError(f"{name} creates nothing in schema {schema}" + (f" (its tables are in {', '.join(elsewhere)})" if elsewhere else ""),
                         where=name, hint="give the dump of the database whose tables live in that schema (pg_dump --schema-only), "
                         "and name the schema with --from-schema")
    ext_schemas = _extension_schemas(raws)
    renamer = Renamer(schema, placeholder, made)

    def own_path(values: list[str]) -> list[str]:
        out: list[str] = []
        for v in values:
            out += [placeholder, schema] if v == schema and schema in ext_schemas else [placeholder] if v == schema else [v]
        return out

    scope = collect_scope(raws)  # names a dump leaves unqualified (pg_dump before 10.3 did) go into the shard as in any file
    scope.path_tail, scope.own_path, scope.rename = tuple(ext_schemas), own_path, renamer
    scope.rename_text = body_renamer(schema, placeholder, made)
    r = _Reading(text, name, schema, owner)
    r.own_path = own_path
    if restricts:
        r.left_out["psql \\restrict lines (pg_dump's guard for psql)"] += restricts
    statements: list[Statement] = []
    for number, raw in enumerate(raws, 1):
        try:
            st = _one(r, number, raw, placeholder, scope, renamer)
        except Refused as e:
            raise r.refused(number, raw, e) from None
        if st is not None:
            statements.append(st)
    if owner is not None and not r.owner_seen:
        raise InputError(f"--owner {owner}: {name} has no OWNER TO statements to turn (dumped with --no-owner, as Rails does)",
                         hint="leave --owner out (the shards' objects then belong to the role pgidgen runs as), or dump with owners")
    while statements and statements[-1].template.startswith("SET LOCAL search_path"):  # Rails' last line: nothing follows
        statements.pop()
        r.turned[_SEARCH_PATH] -= 1
        r.left_out[f"search_path settings (names resolve in the shard: {schema}'s own become the shard's)"] += 1
    r.turned = +r.turned
    for setting, number in r.settings.items():  # settings kept as SET LOCAL hold for this file's statements only
        statements.append(Statement(number, statements[-1].line, 1, "RESET", f"RESET {setting}"))
    return ShardedFile(name=name, source=source, sha256=sha256(source), placeholder=placeholder, statements=tuple(statements),
                       summary=tuple(_summary(r, schema)), extensions=tuple(r.extensions))


def _one(r: _Reading, number: int, raw: ast.RawStmt, placeholder: str, scope: FileScope, renamer: Renamer) -> Statement | None:
    """One statement of the dump: the shard's SQL for it, or None when it is left out (counted in r)."""
    s, schema = raw.stmt, r.schema
    assert s is not None
    handled, kept = _around(r, number, raw, scope)
    if handled:
        return kept
    if isinstance(s, (ast.InsertStmt, ast.CopyStmt)) or (isinstance(s, ast.SelectStmt) and s.targetList):
        raise Refused("it writes data", "give a schema-only dump (pg_dump --schema-only)")
    renamer(s)
    if _pgidgen_own(s, placeholder):
        r.left_out["pgidgen's own objects (init makes next_id() and its sequences in every shard)"] += 1
        return None
    holder = _owner_statement(s)
    if holder is not None:
        r.owner_seen += 1
        if r.owner is None:
            r.left_out["OWNER TO (the shards' objects belong to the role pgidgen runs as; --owner ROLE names another)"] += 1
            return None
        holder.newowner = ast.RoleSpec(roletype=0, rolename=r.owner)
        r.turned[f"OWNER TO into OWNER TO {r.owner}"] += 1
    elif isinstance(s, ast.GrantStmt) and s.objtype == ObjectType.OBJECT_SCHEMA and [getattr(o, "sval", None) for o in s.objects or ()] == [schema]:
        s.objects = (ast.String(sval=placeholder),)
        r.turned[f"GRANT/REVOKE on schema {schema} into the same on the shard's schema"] += 1
    elif isinstance(s, ast.AlterDefaultPrivilegesStmt):
        for o in s.options or ():
            if o.defname == "schemas" and names(o.arg) == [schema]:
                o.arg = (ast.String(sval=placeholder),)
                r.turned[f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} into the shard's schema"] += 1
    else:
        r.taken[_noun(s, r.as_is(number, raw, "").kind)] += 1
        if isinstance(s, ast.CreateFunctionStmt) and any(o.defname == "set" and getattr(o.arg, "name", None) == "search_path" for o in s.options or ()):
            r.turned["functions' own SET search_path into the shard's"] += 1
    return statement_at(r.source, r.name, number, raw, placeholder, scope)


def _around(r: _Reading, number: int, raw: ast.RawStmt, scope: FileScope) -> tuple[bool, Statement | None]:
    """What pg_dump and Rails write around a schema: (True, the shard's SQL or None) when this is such a statement."""
    s, schema = raw.stmt, r.schema
    setting = _setting(s)
    if setting is not None:
        return True, _session(r, number, raw, *setting)
    versions = _rails_versions(s, schema)
    if versions is not None:
        r.versions += versions
        r.left_out[_RAILS] += 1
        return True, None
    if isinstance(s, ast.CreateExtensionStmt):
        s.if_not_exists = True
        sql_text = RawStream()(s)
        home = next((getattr(o.arg, "sval", None) for o in s.options or () if o.defname == "schema"), None)
        r.extensions.append((str(s.extname), r.schemas_made.get(str(home), "") + sql_text + ";"))
        r.turned["CREATE EXTENSION (checked in every database before anything runs; created where missing)"] += 1
        return True, r.as_is(number, raw, sql_text)
    if _clean_drop(s):
        r.left_out["DROP and ALTER ... DROP of pg_dump --clean (the shards start without them: nothing to drop)"] += 1
        return True, None
    if _large_object(s):
        r.left_out["large objects (the database's, not a schema's)"] += 1
        return True, None
    about = _about_schema(s)
    if isinstance(s, ast.CommentStmt) and s.objtype == ObjectType.OBJECT_EXTENSION:
        r.left_out["COMMENT ON EXTENSION (the extension's own)"] += 1
    elif about == schema and isinstance(s, ast.GrantStmt):
        return False, None  # a grant on the schema itself is turned into the shard's (_one)
    elif about == schema:
        r.left_out[f"CREATE SCHEMA {schema}, its owner and comment (the shards are schemas pgidgen made)"] += 1
    elif about is not None and about in scope.path_tail and isinstance(s, ast.CreateSchemaStmt):
        s.if_not_exists = True
        r.turned["CREATE SCHEMA of an extension into IF NOT EXISTS"] += 1
        r.schemas_made[about] = RawStream()(s) + "; "  # ahead of its extensions, when they are checked
        return True, r.as_is(number, raw, RawStream()(s))
    elif about is not None and about in scope.path_tail:
        r.left_out["owner, comment and grants of the extensions' schemas (the database's)"] += 1
    else:
        return False, None
    return True, None


def _session(r: _Reading, number: int, raw: ast.RawStmt, key: str, value: str) -> Statement | None:
    """A SET (or set_config): refused when it changes how the file reads, kept as SET LOCAL when it changes what the
    statements make, left out otherwise."""
    s = raw.stmt
    if key == "client_encoding" and value.replace("-", "").replace("_", "").lower() not in ("utf8", "unicode"):
        raise Refused(f"the dump is in encoding {value}", "pgidgen reads UTF-8: dump with pg_dump --encoding=UTF8")
    if key == "standard_conforming_strings" and _off(value) == "false":
        raise Refused("the dump writes strings with standard_conforming_strings off",
                       "dump with a pg_dump of PostgreSQL 9.1 or newer (they write on)")
    if key in _KEPT_SETTINGS and isinstance(s, ast.VariableSetStmt) and s.args and _off(value) != _KEPT_SETTINGS[key]:
        r.turned[f"SET {key} into SET LOCAL while the shard's statements run"] += 1
        r.settings.setdefault(key, number)
        s.is_local = True
        return r.as_is(number, raw, RawStream()(s))
    if key == "search_path" and isinstance(s, ast.VariableSetStmt) and r.own_path is not None and r.schema in path_values(s):
        # pg_dump before 10.3 wrote names unqualified after `SET search_path = public, pg_catalog`: in the shard they
        # resolve through the shard, then what else the dump's path held (its extensions' operator classes)
        values = [v for v in r.own_path(path_values(s)) if v != "$user"]
        s.args = tuple(ast.A_Const(isnull=False, val=ast.String(sval=v)) for v in values + ([] if "pg_temp" in values else ["pg_temp"]))
        s.is_local = True
        r.turned[_SEARCH_PATH] += 1
        return r.as_is(number, raw, RawStream()(s))
    if key == "search_path":
        r.left_out[f"search_path settings (names resolve in the shard: {r.schema}'s own become the shard's)"] += 1
    elif key in ("session_authorization", "role"):
        r.left_out["SET ROLE / SESSION AUTHORIZATION (objects belong to the role pgidgen runs as)"] += 1
    else:
        r.left_out["SET (the session's settings: pgidgen's own apply)"] += 1
    return None


def _about_schema(s: Any) -> str | None:
    """The schema a statement is about itself: CREATE SCHEMA, ALTER SCHEMA ... OWNER TO, COMMENT ON SCHEMA, GRANT ON SCHEMA."""
    if isinstance(s, ast.CreateSchemaStmt):
        return str(s.schemaname)
    if isinstance(s, ast.AlterOwnerStmt) and s.objectType == ObjectType.OBJECT_SCHEMA:
        return getattr(s.object, "sval", None)
    if isinstance(s, ast.CommentStmt) and s.objtype == ObjectType.OBJECT_SCHEMA:
        return getattr(s.object, "sval", None)
    if isinstance(s, ast.GrantStmt) and s.objtype == ObjectType.OBJECT_SCHEMA and s.objects and len(s.objects) == 1:
        return getattr(s.objects[0], "sval", None)
    return None


def _clean_drop(s: Any) -> bool:
    """What pg_dump --clean writes ahead of the schema to drop it first; nothing else in a dump removes anything."""
    if isinstance(s, ast.DropStmt):
        return True
    if isinstance(s, ast.AlterDomainStmt):
        return s.subtype == "X"
    if isinstance(s, ast.AlterTableStmt) and s.cmds:
        return all(c.subtype in (AlterTableType.AT_DropConstraint, AlterTableType.AT_DetachPartition)
                   or (c.subtype == AlterTableType.AT_ColumnDefault and c.def_ is None) for c in s.cmds)
    return False


def _large_object(s: Any) -> bool:
    if isinstance(s, ast.SelectStmt) and s.targetList and len(s.targetList) == 1:
        f = s.targetList[0].val
        return isinstance(f, ast.FuncCall) and names(f.funcname)[-1:] == ["lo_create"]
    kind = s.objectType if isinstance(s, ast.AlterOwnerStmt) else s.objtype if isinstance(s, (ast.CommentStmt, ast.GrantStmt)) else None
    return bool(kind == ObjectType.OBJECT_LARGEOBJECT)


_ONE = {"tables": "table", "views": "view", "materialized views": "materialized view", "indexes": "index", "sequences": "sequence",
        "triggers": "trigger", "types": "type", "domains": "domain", "policies": "policy", "rules": "rule", "operator classes": "operator class",
        "operator families": "operator family", "casts": "cast", "comments": "comment", "grants": "grant", "functions": "function",
        "procedures": "procedure", "aggregates": "aggregate", "operators": "operator", "collations": "collation",
        "text search objects": "text search object"}


def _noun(s: Any, kind: str) -> str:
    if isinstance(s, ast.CreateFunctionStmt):
        return "procedures" if s.is_procedure else "functions"
    if isinstance(s, ast.DefineStmt):
        return _DEFINE_NOUNS.get(s.kind, "text search objects") if s.kind is not None else kind
    if isinstance(s, (ast.AlterTSConfigurationStmt, ast.AlterTSDictionaryStmt)):
        return "ALTER TEXT SEARCH " + ("CONFIGURATION" if isinstance(s, ast.AlterTSConfigurationStmt) else "DICTIONARY")
    return _NOUNS.get(type(s).__name__, kind)


def _summary(r: _Reading, schema: str) -> list[str]:
    def join(c: Counter[str]) -> str:
        return "; ".join(f"{n} {what}" for what, n in c.items())

    order = list(_ONE)
    taken = sorted(r.taken.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
    if _RAILS in r.left_out:
        r.left_out[f"{_RAILS} ({r.versions} version{'s' if r.versions != 1 else ''}: Rails' record, kept once in the ledger's copy of the file,"
                   " not in every shard)"] = r.left_out.pop(_RAILS)
    return [f"from schema {schema}, taken for every shard: " + ", ".join(f"{n} {_ONE.get(what, what) if n == 1 else what}" for what, n in taken)] + \
        ([f"turned: {join(r.turned)}"] if r.turned else []) + ([f"left out: {join(r.left_out)}"] if r.left_out else [])
