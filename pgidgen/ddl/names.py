"""What a name in a sharded statement may be: the shard's own (unqualified, or already qualified with the
placeholder), another schema's (referenced only), or out of bounds (pgidgen's catalog, another shard). The
object a statement creates or changes is qualified here, by its kind of name; rewrite.py walks the rest."""
from __future__ import annotations

import re
from typing import Any

from pglast import ast
from pglast.enums import ObjectType

SHARD_RE = re.compile(r"^shard_(0|[1-9][0-9]*)$")

#: Relation-like objects whose names are plain name lists in COMMENT ON / DROP.
REL_OBJECTS = {
    ObjectType.OBJECT_TABLE,
    ObjectType.OBJECT_VIEW,
    ObjectType.OBJECT_MATVIEW,
    ObjectType.OBJECT_INDEX,
    ObjectType.OBJECT_SEQUENCE,
}
#: Other objects named by a plain (schema, name) list: the shard's collations, statistics, text search objects.
_NAMED_OBJECTS = {
    ObjectType.OBJECT_COLLATION,
    ObjectType.OBJECT_STATISTIC_EXT,
    ObjectType.OBJECT_TSCONFIGURATION,
    ObjectType.OBJECT_TSDICTIONARY,
    ObjectType.OBJECT_TSPARSER,
    ObjectType.OBJECT_TSTEMPLATE,
}
#: Objects named [table, name] (COMMENT ON COLUMN photos.caption, DROP TRIGGER t ON photos, ...).
ON_TABLE_OBJECTS = {
    ObjectType.OBJECT_COLUMN,
    ObjectType.OBJECT_TABCONSTRAINT,
    ObjectType.OBJECT_TRIGGER,
    ObjectType.OBJECT_POLICY,
    ObjectType.OBJECT_RULE,
}
FUNC_OBJECTS = {ObjectType.OBJECT_FUNCTION, ObjectType.OBJECT_PROCEDURE, ObjectType.OBJECT_ROUTINE}
#: Named with their argument types, as functions are.
_WITH_ARGS = FUNC_OBJECTS | {ObjectType.OBJECT_AGGREGATE, ObjectType.OBJECT_OPERATOR}
TYPE_OBJECTS = {ObjectType.OBJECT_TYPE, ObjectType.OBJECT_DOMAIN}
#: Named [access method, (schema,) name].
_WITH_METHOD = {ObjectType.OBJECT_OPCLASS, ObjectType.OBJECT_OPFAMILY}


class Refused(Exception):
    """A statement that cannot be sharded; turned into an InputError with its position by parse_file."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint


def names(node: Any) -> list[str]:
    return [n.sval for n in node] if node else []


def forbidden(schema: str | None) -> bool:
    return schema is not None and (schema == "pgidgen" or bool(SHARD_RE.match(schema)))


def refuse_schema(schema: str, thing: str) -> Refused:
    if schema == "pgidgen":
        return Refused(f"it names {thing} in pgidgen's catalog schema", "the catalog is pgidgen's own; leave it out of sharded files")
    return Refused(
        f"it names {thing} in shard schema {schema}",
        "write names unqualified (and next_id() without a schema): pgidgen puts them into every shard itself",
    )


def shared_target(qualified: str) -> Refused:
    return Refused(
        f"it would change {qualified} once per shard",
        "a sharded file creates and changes objects inside the shards only; objects qualified with a schema may be referenced, "
        "not created or changed: manage them outside pgidgen",
    )


def qualify_names(parts_in: Any, placeholder: str, *, base: int, thing: str) -> tuple[ast.String, ...]:
    """A name list whose last `base` items name the object within its schema: prefix the shard's schema
    (a name already qualified with the placeholder, as --from-schema writes the dump's own, is the shard's)."""
    parts = names(parts_in)
    if len(parts) == base + 1 and parts[0] == placeholder:
        return tuple(ast.String(sval=p) for p in parts)
    if len(parts) > base:
        schema = parts[-base - 1]
        if forbidden(schema):
            raise refuse_schema(schema, f"{thing} {'.'.join(parts[-base:])}")
        raise shared_target(".".join(parts))
    return (ast.String(sval=placeholder),) + tuple(ast.String(sval=p) for p in parts)


def target_rangevar(rv: ast.RangeVar | None, targets: set[int], placeholder: str) -> None:
    """The relation a statement creates or changes: the shard's, or refused."""
    if rv is None or rv.schemaname == placeholder:
        return
    if rv.schemaname is not None:
        if forbidden(rv.schemaname):
            raise refuse_schema(rv.schemaname, f"relation {rv.relname}")
        raise shared_target(f"{rv.schemaname}.{rv.relname}")
    targets.add(id(rv))


def changed_parent(rv: Any, placeholder: str) -> None:
    """A table a statement attaches to or detaches from another (INHERITS, PARTITION OF, INHERIT, ATTACH
    PARTITION): both change, so a qualified one is a shared object changed once per shard."""
    if isinstance(rv, ast.RangeVar) and rv.schemaname is not None and rv.schemaname != placeholder:
        if forbidden(rv.schemaname):
            raise refuse_schema(rv.schemaname, f"relation {rv.relname}")
        raise shared_target(f"{rv.schemaname}.{rv.relname}")


def _own_qualified(parts: list[str], placeholder: str, thing: str) -> None:
    """A qualified name of an object with arguments (a function, an aggregate, an operator): the shard's or refused;
    an unqualified one is qualified by rewrite's visitor."""
    if len(parts) > 1 and not (len(parts) == 2 and parts[0] == placeholder):
        raise refuse_schema(parts[-2], f"{thing} {parts[-1]}") if forbidden(parts[-2]) else shared_target(".".join(parts))


def objects_in_names(objtype: ObjectType | None, obj: Any, placeholder: str, what: str) -> Any:
    """COMMENT ON / DROP / ALTER ... OWNER targets: qualify the object's name with the shard's schema, by object type."""
    if objtype in REL_OBJECTS or objtype in _NAMED_OBJECTS:
        return qualify_names(obj, placeholder, base=1, thing=what)
    if objtype in ON_TABLE_OBJECTS:
        return qualify_names(obj, placeholder, base=2, thing=what)
    if objtype in _WITH_ARGS:
        _own_qualified(names(obj.objname), placeholder, "operator" if objtype == ObjectType.OBJECT_OPERATOR else "function")
        return obj  # the visitor qualifies an unqualified name
    if objtype in _WITH_METHOD:
        method, *rest = obj
        return (method, *qualify_names(rest, placeholder, base=1, thing="operator class"))
    if objtype in TYPE_OBJECTS:
        if isinstance(obj, ast.TypeName):
            obj.names = qualify_names(obj.names, placeholder, base=1, thing="type")
            return obj
        return qualify_names(obj, placeholder, base=1, thing="type")  # ALTER TYPE ... OWNER TO names it as a plain list
    if objtype == ObjectType.OBJECT_DOMCONSTRAINT:
        domain, constraint = obj
        domain.names = qualify_names(domain.names, placeholder, base=1, thing="domain")
        return (domain, constraint)
    if objtype == ObjectType.OBJECT_SCHEMA:
        raise Refused("it names a schema", "shards are schemas pgidgen manages; write tables unqualified and pgidgen puts them into every shard")
    kind = objtype.name[7:].lower().replace("_", " ") if objtype is not None else "these"
    raise Refused(f"pgidgen does not shard {what} on {kind} objects", "run it outside pgidgen")


_LITERAL_SCHEMA_RE = re.compile(r'^\s*(?:"((?:[^"]|"")+)"|([^".]+))\s*\.\s*(.+)$')


def literal_schema(text: str) -> tuple[str, str] | None:
    """('schema', 'rest') of a qualified name written in a string ('public.x_seq', '"My".x'), else None."""
    m = _LITERAL_SCHEMA_RE.match(text)
    if not m:
        return None
    schema = m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2).strip().lower()
    return schema, m.group(3).strip()


def check_relation_literal(arg: Any) -> None:
    """A relation named in a string ('shard_3.s'::regclass, nextval('pgidgen.x')) is looked up by name when the
    statement runs in each shard: a shard or catalog schema in it would tie every shard to that one object."""
    if not (isinstance(arg, ast.A_Const) and isinstance(arg.val, ast.String)):
        return
    found = literal_schema(arg.val.sval or "")
    if found and forbidden(found[0]):
        raise refuse_schema(found[0], f"relation {found[1]} (in a string)")


def check_bound_early(fn: str, arg: Any) -> None:
    """nextval('s') binds the sequence when the statement runs in each shard (a regclass constant: that shard's
    own s). Cast to text first, nextval('s'::text), it is looked up by name on every call, through the calling
    session's search_path, which does not lead into the shard: every shard would share public.s, or fail."""
    while isinstance(arg, ast.TypeCast) and arg.typeName is not None:  # 's'::text::regclass too (old SERIAL defaults)
        if names(arg.typeName.names)[-1:] != ["regclass"]:
            raise Refused(
                f"{fn}() takes its sequence's name as {'.'.join(names(arg.typeName.names))}, looked up on every call through the caller's search_path, not in the shard",
                f"write {fn}('name') with the name as a plain string (or ::regclass): each shard then uses its own sequence",
            )
        arg = arg.arg
