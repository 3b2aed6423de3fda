"""What a DDL file will lock, before it runs: per statement, the lock mode on which table, whether the table is
rewritten or scanned under it, and the known dangerous forms with their online alternative (apply-ddl --dry-run).

The modes follow PostgreSQL's ALTER TABLE page and the "Explicit Locking" table (AlterTableGetLockLevel in
tablecmds.c), the same on 15 to 18; what differs by major is said in the warnings (NOT NULL ... NOT VALID and
VIRTUAL generated columns are 18's). Parsed only: what depends on the table's contents (a type change from varchar
to text, a default calling a function of unknown volatility) is `rewrites=None`, and a table's size comes from the
first shard when the caller read it (read_sizes).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from pglast import ast, parse_sql
from pglast.enums import AlterTableType as AT
from pglast.enums import ConstrType, ObjectType

from ..config import Config
from ..db import connect, pg_message
from ..errors import PgidgenError
from ..idgen import schema_name
from .positions import _kind, _skip_space, line_col

#: PostgreSQL's table lock modes, weakest first
MODES = ("ACCESS SHARE", "ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
         "EXCLUSIVE", "ACCESS EXCLUSIVE")
AE, SUE, SRE, SHARE = "ACCESS EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE ROW EXCLUSIVE", "SHARE"
#: what the application's queries do while a mode is held
BLOCKS = {
    "ACCESS EXCLUSIVE": "reads and writes wait",
    "EXCLUSIVE": "writes wait",
    "SHARE ROW EXCLUSIVE": "writes wait",
    "SHARE": "writes wait",
    "SHARE UPDATE EXCLUSIVE": "reads and writes go on",
    "ROW EXCLUSIVE": "reads and writes go on",
    "ROW SHARE": "reads and writes go on",
    "ACCESS SHARE": "reads and writes go on",
}
#: a plain CREATE INDEX on a table at least this big gets a warning (10 MiB builds in about a second)
BIG_TABLE = 10 * 1024 * 1024

_VOLATILE = {"random", "clock_timestamp", "timeofday", "nextval", "gen_random_uuid", "uuid_generate_v1", "uuid_generate_v1mc",
             "uuid_generate_v4", "uuidv4", "uuidv7", "next_id", "setseed", "txid_current", "random_normal"}
_NOT_VOLATILE = {"now", "statement_timestamp", "transaction_timestamp", "current_setting", "lower", "upper", "coalesce",
                 "make_date", "make_timestamp", "make_timestamptz", "to_timestamp", "jsonb_build_object", "json_build_object"}
_SERIAL = {"serial", "serial4", "serial8", "bigserial", "smallserial", "serial2"}
#: SET (...) options taken with SHARE UPDATE EXCLUSIVE (reloptions.c); any other one takes ACCESS EXCLUSIVE
_LIGHT_OPTIONS = ("fillfactor", "toast_tuple_target", "parallel_workers", "autovacuum_", "toast.", "vacuum_",
                  "log_autovacuum_min_duration")
#: binary-coercible targets: a change to these from varchar/text (or a wider numeric) keeps the table
_MAYBE_COERCIBLE = {"text", "varchar", "numeric", "bpchar", "citext", "inet", "varbit"}

_ADD_LATER = "add it NOT VALID, then VALIDATE CONSTRAINT in a later file (SHARE UPDATE EXCLUSIVE: reads and writes go on)"


@dataclass(frozen=True)
class Lock:
    table: str
    mode: str

    @property
    def blocks(self) -> str:
        return BLOCKS[self.mode]


@dataclass
class StatementLocks:
    """One statement of a file: the locks it takes and what it does to the table under them."""

    number: int
    line: int
    kind: str
    what: str
    locks: list[Lock] = field(default_factory=list)
    #: True: the table (and its indexes) is rewritten; None: depends on what the table holds
    rewrites: bool | None = False
    #: every row is read under the lock (a constraint validated, SET NOT NULL, an index built)
    scans: bool = False
    warnings: list[str] = field(default_factory=list)
    #: table.column of each type change whose rewrite depends on the column's type before (read from the first shard)
    retyped: list[str] = field(default_factory=list)
    #: every table it locks is one the file created before it (or it locks none): nobody else can be waiting
    harmless: bool = True

    def lock(self, table: str, mode: str) -> None:
        """Keep the strongest mode per table (an ALTER TABLE of several subcommands takes the strongest)."""
        for i, held in enumerate(self.locks):
            if held.table == table:
                if MODES.index(mode) > MODES.index(held.mode):
                    self.locks[i] = Lock(table, mode)
                return
        self.locks.append(Lock(table, mode))

    def rewrite(self, value: bool | None) -> None:
        if value is True or (value is None and self.rewrites is False):
            self.rewrites = value

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["locks"] = [{"table": lk.table, "mode": lk.mode, "blocks": lk.blocks} for lk in self.locks]
        return d

    def describe(self) -> str:
        locks = "; ".join(f"{lk.mode} on {lk.table} ({lk.blocks})" for lk in self.locks) or "no lock on an existing table"
        rewrite = {True: "rewrites the table", None: "may rewrite the table", False: "no rewrite"}[self.rewrites]
        scan = ", reads every row" if self.scans and self.rewrites is not True else ""
        return f"statement {self.number} (line {self.line}) {self.what}: {locks}; {rewrite}{scan}"


class _Names:
    """Relation names as the user wrote them: a shard's own (qualified with the placeholder, or unqualified) bare."""

    def __init__(self, placeholder: str | None) -> None:
        self.placeholder = placeholder

    def __call__(self, rv: Any) -> str:
        schema = getattr(rv, "schemaname", None)
        if schema is None or schema == self.placeholder:
            return str(rv.relname)
        return f"{schema}.{rv.relname}"


def plan_file(file: Any, *, sizes: Mapping[str, int] | None = None, big_table: int = BIG_TABLE,
              columns: Mapping[tuple[str, str], str] | None = None) -> list[StatementLocks]:
    """The lock plan of a parsed ShardedFile (rewrite.py), statement by statement, from its shard templates;
    sizes: bytes per table, columns: format_type() per (table, column) as the first shard has them."""
    names = _Names(file.placeholder)
    items = [(s.number, s.line, s.kind, parse_sql(s.template)[0].stmt) for s in file.statements]
    return _plan(items, names, sizes, big_table, columns or {})


def plan_source(source: str, *, sizes: Mapping[str, int] | None = None, big_table: int = BIG_TABLE) -> list[StatementLocks]:
    """The lock plan of SQL text as written (unchecked: CONCURRENTLY forms too)."""
    items = []
    for number, raw in enumerate(parse_sql(source), 1):
        start = _skip_space(source, raw.stmt_location or 0)
        items.append((number, line_col(source, start)[0], _kind(source, start), raw.stmt))
    return _plan(items, _Names(None), sizes, big_table, {})


def tables_of(plan: Iterable[StatementLocks]) -> list[str]:
    """The shard's tables the plan locks (bare names), for read_sizes."""
    return sorted({lk.table for s in plan for lk in s.locks if "." not in lk.table})


def read_sizes(conn: psycopg.Connection[Any], schema: str, tables: Sequence[str]) -> dict[str, int]:
    """pg_relation_size of each table that exists in schema; waits at most 100 ms for a lock (an ALTER may queue)."""
    conn.execute("SET lock_timeout = '100ms'")
    rows = conn.execute(
        "SELECT t, pg_catalog.pg_relation_size(c.oid) FROM unnest(%s::text[]) t"
        " JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %s::text, t))",
        (list(tables), schema),
    ).fetchall()
    return {str(t): int(n) for t, n in rows}


@dataclass
class Forecast:
    """apply-ddl --dry-run's answer: the plan, and where the table sizes came from (or why they did not)."""

    statements: list[StatementLocks]
    sizes_from: str | None = None
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"statements": [s.as_dict() for s in self.statements], "sizes_from": self.sizes_from, "note": self.note}


def forecast(config: Config, file: Any, databases: Sequence[str], *, big_table: int = BIG_TABLE) -> Forecast:
    """The lock plan, with the sizes of the tables it locks read from the first active shard of the first database
    (a plain CREATE INDEX is then warned about by size); without a connection, by the rule alone."""
    tables = tables_of(plan_file(file))
    if not tables or not databases:
        return Forecast(plan_file(file, big_table=big_table))
    name = databases[0]
    try:
        with connect(name, config.databases[name], autocommit=True) as conn:
            row = conn.execute("SELECT min(shard) FROM pgidgen.shards WHERE state = 'active'"
                               if conn.execute("SELECT to_regclass('pgidgen.shards') IS NOT NULL").fetchone() == (True,)
                               else "SELECT NULL::int").fetchone()
            if row is None or row[0] is None:
                return Forecast(plan_file(file, big_table=big_table), note=f"table sizes not read: {name} holds no shard")
            shard = int(row[0])
            sizes = read_sizes(conn, schema_name(shard), tables)
            retyped = [c for s in plan_file(file) for c in s.retyped]
            columns = read_types(conn, schema_name(shard), retyped) if retyped else {}
    except PgidgenError as e:
        return Forecast(plan_file(file, big_table=big_table), note=f"table sizes not read: {e.what}")
    except psycopg.Error as e:
        return Forecast(plan_file(file, big_table=big_table), note=f"table sizes not read from {name}: {pg_message(e)}")
    return Forecast(plan_file(file, sizes=sizes, big_table=big_table, columns=columns), sizes_from=f"{name} {schema_name(shard)}")


def read_types(conn: psycopg.Connection[Any], schema: str, retyped: Sequence[str]) -> dict[tuple[str, str], str]:
    """format_type() of each table.column that exists in schema (catalog rows only: no lock taken)."""
    pairs = [c.split(".", 1) for c in retyped]
    rows = conn.execute(
        "SELECT t, c, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM unnest(%s::text[], %s::text[]) AS u(t, c)"
        " JOIN pg_catalog.pg_attribute a ON a.attrelid = pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %s::text, t))"
        " AND a.attname = c AND NOT a.attisdropped",
        ([p[0] for p in pairs], [p[1] for p in pairs], schema),
    ).fetchall()
    return {(str(t), str(c)): str(f) for t, c, f in rows}


def _plan(items: Iterable[tuple[int, int, str, Any]], names: _Names, sizes: Mapping[str, int] | None, big_table: int,
          columns: Mapping[tuple[str, str], str]) -> list[StatementLocks]:
    created: set[str] = set()
    out = []
    for number, line, kind, node in items:
        rec = StatementLocks(number, line, kind, kind)
        _classify(node, rec, names, created, sizes, big_table, columns)
        rec.harmless = not rec.warnings and all(lk.table in created for lk in rec.locks)
        if type(node).__name__ in ("CreateStmt", "CreateTableAsStmt"):
            created.add(names(node.relation if hasattr(node, "relation") else node.into.rel))
        out.append(rec)
    return out


def _classify(node: Any, rec: StatementLocks, names: _Names, created: set[str], sizes: Mapping[str, int] | None, big_table: int,
              columns: Mapping[tuple[str, str], str]) -> None:
    k = type(node).__name__  # by name: pglast's Optional fields would need a check each under isinstance
    if k == "AlterTableStmt":
        table = names(node.relation)
        rec.what = f"{rec.kind} {table} " + ", ".join(_subcommand(c) for c in node.cmds)
        rec.lock(table, "ACCESS SHARE")  # first in the list; each subcommand raises it
        for cmd in node.cmds:
            _alter(cmd, table, rec, names, table in created, columns)
    elif k == "IndexStmt":
        table = names(node.relation)
        rec.what = f"{rec.kind} on {table}"
        rec.lock(table, SUE if node.concurrent else SHARE)
        rec.scans = True
        if not node.concurrent and table not in created:
            size = None if sizes is None else sizes.get(table)
            if size is not None and size >= big_table:
                rec.warnings.append(f"{table} holds {_mib(size)} on the first shard: writes wait while the index builds;"
                                    " use CREATE INDEX CONCURRENTLY")
            elif sizes is None:
                rec.warnings.append(f"writes to {table} wait while the index builds: on a table over {_mib(big_table)}"
                                    " use CREATE INDEX CONCURRENTLY")
    elif k == "CreateStmt":
        rec.what = f"{rec.kind} {names(node.relation)}"
        if node.partbound is not None:
            for parent in node.inhRelations or ():
                rec.lock(names(parent), AE)
        for elt in node.tableElts or ():
            for con in ((elt,) if isinstance(elt, ast.Constraint) else getattr(elt, "constraints", None) or ()):
                if isinstance(con, ast.Constraint) and con.contype == ConstrType.CONSTR_FOREIGN and con.pktable is not None:
                    rec.lock(names(con.pktable), SRE)
    elif k == "DropStmt":
        _drop(node, rec, names)
    elif k == "TruncateStmt":
        for rv in node.relations:
            rec.lock(names(rv), AE)
    elif k == "CreateTrigStmt":
        rec.what = f"{rec.kind} on {names(node.relation)}"
        rec.lock(names(node.relation), SRE)
    elif k == "RenameStmt" and node.relation is not None:
        light = node.renameType == ObjectType.OBJECT_INDEX
        rec.what = f"{rec.kind} {names(node.relation)} RENAME"
        rec.lock(names(node.relation), SUE if light else AE)
    elif k in ("CreatePolicyStmt", "AlterPolicyStmt"):
        rec.lock(names(node.table), AE)
    elif k == "RuleStmt":
        rec.lock(names(node.relation), AE)
    elif k == "CreateStatsStmt":
        for rv in node.relations or ():
            if isinstance(rv, ast.RangeVar):
                rec.lock(names(rv), SUE)
    elif k == "ClusterStmt" and node.relation is not None:
        rec.lock(names(node.relation), AE)
        rec.rewrite(True)
        rec.warnings.append("CLUSTER rewrites the table under ACCESS EXCLUSIVE: reads and writes wait until it ends")
    elif k == "VacuumStmt":
        full = any(o.defname == "full" for o in node.options or ())
        for vr in node.rels or ():
            rec.lock(names(vr.relation), AE if full else SUE)
        if full:
            rec.rewrite(True)
            rec.warnings.append("VACUUM FULL rewrites the table under ACCESS EXCLUSIVE: reads and writes wait until it ends")
    elif k == "ReindexStmt" and node.relation is not None:
        concurrent = any(o.defname == "concurrently" for o in node.params or ())
        rec.lock(names(node.relation), SUE if concurrent else SHARE)
        rec.scans = True
        if not concurrent:
            rec.warnings.append("writes wait while the index is rebuilt (and reads using it): use REINDEX CONCURRENTLY")
    elif k == "LockStmt":
        for rv in node.relations:
            rec.lock(names(rv), MODES[node.mode - 1])
    elif k == "RefreshMatViewStmt":
        rec.lock(names(node.relation), "EXCLUSIVE" if node.concurrent else AE)
    elif k == "CommentStmt" and node.objtype in (ObjectType.OBJECT_TABLE, ObjectType.OBJECT_COLUMN):
        parts = [s.sval for s in node.object] if isinstance(node.object, tuple) else []
        if parts:
            rel = parts[:-1] if node.objtype == ObjectType.OBJECT_COLUMN else parts
            rec.lock(names(ast.RangeVar(relname=rel[-1], schemaname=rel[-2] if len(rel) > 1 else None)), SUE)


def _drop(node: Any, rec: StatementLocks, names: _Names) -> None:
    kinds = {ObjectType.OBJECT_TABLE, ObjectType.OBJECT_INDEX, ObjectType.OBJECT_VIEW, ObjectType.OBJECT_MATVIEW,
             ObjectType.OBJECT_SEQUENCE, ObjectType.OBJECT_FOREIGN_TABLE}
    on_table = {ObjectType.OBJECT_TRIGGER, ObjectType.OBJECT_POLICY, ObjectType.OBJECT_RULE}
    for obj in node.objects or ():
        parts = [s.sval for s in obj] if isinstance(obj, tuple) else []
        if not parts:
            continue
        if node.removeType in kinds:
            rel = parts
        elif node.removeType in on_table and len(parts) > 1:
            rel = parts[:-1]
        else:
            continue
        mode = SUE if node.removeType == ObjectType.OBJECT_INDEX and node.concurrent else AE
        rec.lock(names(ast.RangeVar(relname=rel[-1], schemaname=rel[-2] if len(rel) > 1 else None)), mode)


_NICE = {
    AT.AT_AddColumn: "ADD COLUMN {}", AT.AT_DropColumn: "DROP COLUMN {}", AT.AT_AlterColumnType: "ALTER COLUMN {} TYPE",
    AT.AT_ColumnDefault: "ALTER COLUMN {} DEFAULT", AT.AT_SetNotNull: "ALTER COLUMN {} SET NOT NULL",
    AT.AT_DropNotNull: "ALTER COLUMN {} DROP NOT NULL", AT.AT_SetStatistics: "ALTER COLUMN {} SET STATISTICS",
    AT.AT_SetRelOptions: "SET (...)", AT.AT_ResetRelOptions: "RESET (...)", AT.AT_AddConstraint: "ADD CONSTRAINT {}",
    AT.AT_ValidateConstraint: "VALIDATE CONSTRAINT {}", AT.AT_DropConstraint: "DROP CONSTRAINT {}",
    AT.AT_EnableTrig: "ENABLE TRIGGER {}", AT.AT_DisableTrig: "DISABLE TRIGGER {}",
}
_CONSTRAINTS = {ConstrType.CONSTR_FOREIGN: "FOREIGN KEY", ConstrType.CONSTR_PRIMARY: "PRIMARY KEY", ConstrType.CONSTR_UNIQUE: "UNIQUE",
                ConstrType.CONSTR_CHECK: "CHECK", ConstrType.CONSTR_NOTNULL: "NOT NULL", ConstrType.CONSTR_EXCLUSION: "EXCLUDE"}


def _subcommand(cmd: Any) -> str:
    """ALTER TABLE's subcommand in words: ADD COLUMN note, ADD CONSTRAINT fk FOREIGN KEY, SET LOGGED."""
    target = cmd.name or (cmd.def_.colname if isinstance(cmd.def_, ast.ColumnDef) else None)
    if isinstance(cmd.def_, ast.Constraint):
        target = cmd.def_.conname
    words = AT(cmd.subtype).name.removeprefix("AT_")
    text = _NICE.get(cmd.subtype) or "".join(" " + c if c.isupper() else c for c in words).strip().upper() + (" {}" if target else "")
    text = " ".join(text.format(target or "").split())
    if isinstance(cmd.def_, ast.Constraint):
        con: Any = cmd.def_
        text += " " + _CONSTRAINTS.get(con.contype, "")
    return text.strip()


def _alter(cmd: Any, table: str, rec: StatementLocks, names: _Names, new: bool, columns: Mapping[tuple[str, str], str]) -> None:
    t = cmd.subtype
    mode = AE
    if t in (AT.AT_SetStatistics, AT.AT_SetOptions, AT.AT_ResetOptions, AT.AT_ClusterOn, AT.AT_DropCluster,
             AT.AT_ValidateConstraint, AT.AT_AttachPartition, AT.AT_DetachPartitionFinalize):
        mode = SUE
    elif t in (AT.AT_EnableTrig, AT.AT_EnableAlwaysTrig, AT.AT_EnableReplicaTrig, AT.AT_EnableTrigAll,
               AT.AT_EnableTrigUser, AT.AT_DisableTrig, AT.AT_DisableTrigAll, AT.AT_DisableTrigUser):
        mode = SRE
    elif t in (AT.AT_SetRelOptions, AT.AT_ResetRelOptions):
        opts = [f"{d.defnamespace}.{d.defname}" if d.defnamespace else d.defname for d in cmd.def_ or ()]
        mode = SUE if all(o.startswith(_LIGHT_OPTIONS) for o in opts) else AE
    elif t == AT.AT_DetachPartition:
        mode = SUE if cmd.def_.concurrent else AE
    if t == AT.AT_AddConstraint and isinstance(cmd.def_, ast.Constraint):
        mode = _constraint(cmd.def_, table, rec, names, new)
    rec.lock(table, mode)
    if t == AT.AT_AttachPartition:
        rec.lock(names(cmd.def_.name), AE)
        rec.scans = True
    elif t == AT.AT_ValidateConstraint:
        rec.scans = True
    elif t == AT.AT_AddColumn:
        _add_column(cmd.def_, table, rec, names, new)
    elif t == AT.AT_AlterColumnType:
        _type_change(cmd, table, rec, new, columns.get((table, cmd.name)))
    elif t == AT.AT_SetNotNull:
        rec.scans = True
        if not new:
            rec.warnings.append(f"SET NOT NULL reads every row of {table} under ACCESS EXCLUSIVE unless a validated CHECK"
                                f" ({cmd.name} IS NOT NULL) proves it: add that CHECK NOT VALID, VALIDATE CONSTRAINT it in a"
                                " later file, then SET NOT NULL (on PostgreSQL 18: ADD CONSTRAINT ... NOT NULL"
                                f" {cmd.name} NOT VALID, then VALIDATE CONSTRAINT)")
    elif t in (AT.AT_SetLogged, AT.AT_SetUnLogged, AT.AT_SetAccessMethod, AT.AT_SetTableSpace, AT.AT_SetExpression):
        rec.rewrite(True)
        if not new:
            rec.warnings.append(f"{_subcommand(cmd)} rewrites {table} under ACCESS EXCLUSIVE: reads and writes wait until it ends")


def _constraint(con: Any, table: str, rec: StatementLocks, names: _Names, new: bool) -> str:
    kind = con.contype
    if kind == ConstrType.CONSTR_FOREIGN:
        if con.pktable is not None:
            rec.lock(names(con.pktable), SRE)
        if not con.skip_validation:
            rec.scans = True
            if not new:
                rec.warnings.append(f"the foreign key reads every row of {table} while writes to both tables wait: {_ADD_LATER}")
        return SRE
    if kind in (ConstrType.CONSTR_CHECK, ConstrType.CONSTR_NOTNULL) and not con.skip_validation:
        rec.scans = True
        if not new:
            rec.warnings.append(f"the {'CHECK' if kind == ConstrType.CONSTR_CHECK else 'NOT NULL'} constraint reads every row"
                                f" of {table} under ACCESS EXCLUSIVE: {_ADD_LATER}")
    elif kind in (ConstrType.CONSTR_PRIMARY, ConstrType.CONSTR_UNIQUE, ConstrType.CONSTR_EXCLUSION) and not con.indexname:
        rec.scans = True
        if not new:
            what = _CONSTRAINTS[kind]
            rec.warnings.append(f"the {what} constraint builds its index under ACCESS"
                                f" EXCLUSIVE (reads and writes wait): CREATE UNIQUE INDEX CONCURRENTLY first, then ADD {what}"
                                " USING INDEX" if kind != ConstrType.CONSTR_EXCLUSION else
                                f"the EXCLUDE constraint builds its index on {table} under ACCESS EXCLUSIVE (reads and writes wait)")
    return AE


def _add_column(col: Any, table: str, rec: StatementLocks, names: _Names, new: bool) -> None:
    type_name = col.typeName.names[-1].sval if col.typeName is not None else ""
    why: str | None = None
    rewrites: bool | None = False
    if type_name in _SERIAL:
        rewrites, why = True, f"a {type_name} column is filled from a sequence (nextval(), volatile)"
    for con in col.constraints or ():
        if con.contype == ConstrType.CONSTR_DEFAULT:
            volatility = _volatility(con.raw_expr)
            if volatility is not False:
                rewrites = volatility
                why = "its DEFAULT calls " + ", ".join(f"{f}()" for f in _functions(con.raw_expr)) + (
                    "" if volatility else " (volatile ones rewrite)")
        elif con.contype == ConstrType.CONSTR_GENERATED and con.generated_kind == "s":
            rewrites, why = True, "a STORED generated column is computed for every row (PostgreSQL 18's VIRTUAL is not)"
        elif con.contype == ConstrType.CONSTR_IDENTITY:
            rewrites, why = True, "an identity column is filled from a sequence"
        elif con.contype == ConstrType.CONSTR_FOREIGN and con.pktable is not None:
            rec.lock(names(con.pktable), SRE)
            rec.scans = True
        elif con.contype == ConstrType.CONSTR_CHECK:
            rec.scans = True
    rec.rewrite(rewrites)
    if why and not new:
        rec.warnings.append(f"ADD COLUMN {col.colname} {'rewrites' if rewrites else 'may rewrite'} {table} under ACCESS"
                            f" EXCLUSIVE: {why}; add the column without a default (or a constant one), then backfill it in batches")


def _type_change(cmd: Any, table: str, rec: StatementLocks, new: bool, before: str | None) -> None:
    col = cmd.def_
    target = col.typeName.names[-1].sval if col.typeName is not None else ""
    mods = [m.val.ival for m in col.typeName.typmods or () if isinstance(getattr(m, "val", None), ast.Integer)]
    maybe = target in _MAYBE_COERCIBLE and col.raw_default is None  # USING forces a rewrite
    if maybe:
        rec.retyped.append(f"{table}.{cmd.name}")
    if maybe and before is not None:
        if _coercible(before, target, mods):
            return
        maybe = False
    rec.rewrite(None if maybe else True)
    if not new:
        unless = " unless the change is binary-coercible (varchar(n) to text or a wider varchar, a wider numeric)" if maybe else ""
        was = f" (from {before})" if before else ""
        rec.warnings.append(f"ALTER COLUMN {cmd.name} TYPE{was} rewrites {table} and its indexes under ACCESS EXCLUSIVE{unless}:"
                            " add a new column, backfill it in batches, then swap the names")


def _coercible(before: str, target: str, mods: list[int]) -> bool:
    """Whether PostgreSQL changes the type in the catalog only: varchar(n) or text to text or an unbounded or wider
    varchar, numeric(p,s) to numeric or a numeric of the same scale and a wider precision."""
    name, _, rest = before.partition("(")
    old = [int(x) for x in rest.rstrip(")").split(",")] if rest else []
    if name in ("character varying", "text"):
        if target == "text" or (target == "varchar" and not mods):
            return True
        return target == "varchar" and name == "character varying" and bool(old) and mods[0] >= old[0]
    if name == "numeric" and target == "numeric":
        if not mods:
            return True
        return bool(old) and len(mods) == len(old) and mods[0] >= old[0] and mods[1:] == old[1:]
    return False


def _functions(expr: Any) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if type(node).__name__ == "FuncCall":
            found.append(node.funcname[-1].sval)
        if isinstance(node, ast.Node):
            for name in node:
                walk(getattr(node, name))
        elif isinstance(node, tuple):
            for item in node:
                walk(item)

    walk(expr)
    return found


def _volatility(expr: Any) -> bool | None:
    """True: the default is volatile (the column is filled row by row); False: it is not; None: cannot tell."""
    funcs = [f.lower() for f in _functions(expr)]
    if any(f in _VOLATILE for f in funcs):
        return True
    return None if any(f not in _NOT_VOLATILE for f in funcs) else False


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MB" if n >= 1024 * 1024 else f"{n // 1024} kB"
