"""The source database read, and every refusal made before anything is written.

What is read: the schema's tables, each one's key column, replica identity and size; the sequences whose values
the shards must continue from; the shard map (which database serves which shards). What is refused, each with one
line: a source below PostgreSQL 15 or not at wal_level=logical, a role that may not publish or make slots, a table
without the key column (route it with --key-of, keyof.py, or --skip it), a key column that is not an integer or holds NULLs, a table with no
primary key or replica identity, a target database that already has a table of that
name in that schema, or shards that hold rows of those tables already; with --ids next_id, an ID column narrower than
bigint and an existing ID that next_id() could make again (ids.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..config import Config
from ..db import connect, pg_message
from ..errors import ConfigError, ConflictError, DatabaseError, InputError
from ..idgen import schema_name
from ..shardmap import read_map
from .ids import ID_SOURCES, id_bound, id_columns, prove
from .keyof import KeyOf, check_key_of

INTEGER_TYPES = ("smallint", "integer", "bigint")
#: the schema pgidgen keeps its journal, heartbeat and write-refusing function in (on the source), and the
#: staging tables' catch-all partitions in (on each target)
WORK_SCHEMA = "pgidgen_import"


@dataclass
class TablePlan:
    name: str
    #: the publication filters rows by shard for this table: the key is in its replica identity
    filtered: bool
    rows: int = 0
    bytes: int = 0
    #: --key-of: the column that refers to the parent, the parent (a table with the key), its column; the table's
    #: primary key (settle.py routes these rows by their parent's shard)
    via: str | None = None
    parent: str | None = None
    parent_column: str | None = None
    pk: list[str] = field(default_factory=list)

    def route(self) -> str:
        return f"key via {self.via} -> {self.parent}.{self.parent_column}" if self.parent else "key column"


@dataclass
class ImportPlan:
    """Everything an import needs to run, resume or roll back: kept as JSON in the source's journal."""

    schema: str
    key: str
    shard_count: int
    source_oid: int
    tables: list[TablePlan]
    #: database name -> the shards it serves (those with none are left out)
    targets: dict[str, list[int]]
    skipped: list[str] = field(default_factory=list)
    #: sequences of the schema, whose values every shard's copy continues from at the cutover
    sequences: list[str] = field(default_factory=list)
    #: target databases that lack the schema, which the staging step makes and the teardown drops
    make_schema: list[str] = field(default_factory=list)
    follow: bool = False
    #: --ids: "next_id" makes id_columns' defaults next_id() in every shard; None keeps the source's defaults
    ids: str | None = None
    #: table -> its bigint primary key column taking next_id() (with --ids next_id)
    id_columns: dict[str, str] = field(default_factory=dict)
    #: tables among id_columns whose column is an identity column on the source (DROP IDENTITY first)
    identity: list[str] = field(default_factory=list)
    #: every ID next_id() may return is >= this (the proof, made before anything is written and again at the cutover)
    id_bound: int | None = None
    #: source relations whose replica identity lacks the key, set to FULL for the import (a DELETE's old row must
    #: carry the key, or a target could not find its shard), with the clause that gives theirs back at the end
    full_identity: dict[str, str] = field(default_factory=dict)
    #: the tables' owner prepared the source (prepared.py): the publications, identities and gate are theirs
    prepared: bool = False

    def slot(self, database: str) -> str:
        """The slot, publication and subscription name for one target: prefixed, findable, unique per source."""
        return f"pgidgen_import_{self.source_oid}_{sorted(self.targets).index(database)}"

    def share(self, t: TablePlan, database: str, amount: int) -> int:
        """About how much of a table (rows or bytes) a target receives: a filtered table its shards' share, a table
        that is not (a catch-all's, a key-of table's) every row."""
        return amount * len(self.targets[database]) // max(self.shard_count, 1) if t.filtered else amount

    def estimates(self) -> dict[str, tuple[int, int]]:
        """database -> (rows, bytes) it receives, by the planner's statistics of the source's tables."""
        return {n: (sum(self.share(t, n, t.rows) for t in self.tables), sum(self.share(t, n, t.bytes) for t in self.tables)) for n in self.targets}

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImportPlan:
        d = dict(data)
        d["tables"] = [TablePlan(**t) for t in d["tables"]]
        return cls(**d)


def shard_expr(key: str, shard_count: int) -> sql.Composable:
    """The Router's rule (Python's %: a shard from 0 to N - 1 for a negative key too) in SQL of built-in operators
    only, which publication row filters and partition keys accept."""
    n = sql.Literal(shard_count)
    return sql.SQL("((({} % {}) + {}) % {})").format(sql.Identifier(key), n, n, n)


_TABLES_SQL = """
SELECT c.relname, c.relkind, c.relreplident,
       (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = c.oid AND a.attname = %(key)s AND NOT a.attisdropped),
       (SELECT pg_catalog.array_agg(a.attname::text) FROM pg_catalog.pg_index i
          JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = c.oid AND (i.indisprimary AND c.relreplident = 'd' OR i.indisreplident AND c.relreplident = 'i')),
       pg_catalog.pg_has_role(c.relowner, 'USAGE'), greatest(c.reltuples, 0)::bigint, pg_catalog.pg_table_size(c.oid),
       c.relrowsecurity, c.relforcerowsecurity
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""


#: a table and its partitions whose replica identity is not FULL, each with the clause of its own
_IDENTITIES_SQL = """
SELECT pg_catalog.format('%%I.%%I', n.nspname, c.relname),
       CASE c.relreplident WHEN 'd' THEN 'DEFAULT' WHEN 'n' THEN 'NOTHING' ELSE pg_catalog.format('USING INDEX %%I',
         (SELECT ic.relname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
           WHERE i.indrelid = c.oid AND i.indisreplident)) END
FROM (SELECT relid, level FROM pg_catalog.pg_partition_tree(%(rel)s::pg_catalog.regclass)  -- none for a plain table
      UNION SELECT %(rel)s::pg_catalog.regclass, 0) t JOIN pg_catalog.pg_class c ON c.oid = t.relid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relreplident <> 'f' AND c.relkind IN ('r', 'p')
ORDER BY t.level, 1
"""


def inspect(config: Config, source: psycopg.Connection[Any], *, schema: str, key: str, skip: Sequence[str], follow: bool,
            ids: str | None = None, key_of: dict[str, KeyOf] | None = None, owner_sql: bool = False) -> ImportPlan:
    """The plan, or the first refusal: reads the source and the shard map; writes nothing anywhere. owner_sql: the
    plan the tables' owner prepares the source for (prepared.py), made by a role that need not own them."""
    routes = key_of or {}
    prepared = prepared_identity(source, schema)
    _check_server(source, own_schema=prepared is None and not owner_sql)
    if prepared is not None or owner_sql:
        _check_prepared_for(source, schema, owner_sql=owner_sql)
    rows = source.execute(_TABLES_SQL, {"schema": schema, "key": key}).fetchall()
    bypass = source.execute("SELECT rolsuper OR rolbypassrls FROM pg_catalog.pg_roles WHERE rolname = current_user").fetchone()
    if not rows:
        raise InputError(f"schema {schema} of the source has no tables", hint="name the schema the application's tables live in (--schema)")
    names = {r[0] for r in rows}
    unknown = sorted(set(skip) - names)
    if unknown:
        raise InputError(f"--skip names {', '.join(unknown)}, not a table of schema {schema}", hint="give the tables' names as \\dt lists them")
    pks = check_key_of(source, schema=schema, key=key, routes=routes, tables=sorted(names), skip=skip, has_key={r[0]: r[3] is not None for r in rows},
                       read_rows=not owner_sql)
    tables: list[TablePlan] = []
    full_identity: dict[str, str] = {}
    for name, _kind, ident, typ, ident_cols, owns, est, size, rls, force_rls in rows:
        if name in skip:
            continue
        where = f"{schema}.{name}"
        if typ is None and name not in routes:
            raise InputError(f"table {where} has no column {key}", where="the source",
                             hint=f"route it through its parent with --key-of {name}=COLUMN:PARENT.PARENTCOL, or leave it out with --skip {name}")
        if typ is not None and typ not in INTEGER_TYPES:
            raise InputError(f"{where}.{key} is {typ}, not an integer", where="the source", hint="pgidgen import routes integer keys (shard = key % shard count)")
        if ident == "n" or (ident in ("d", "i") and not ident_cols):
            raise InputError(f"table {where} has no primary key or replica identity", where="the source",
                             hint=f"its updates could not be carried over: add a primary key, or ALTER TABLE {where} REPLICA IDENTITY USING INDEX <a unique index on NOT NULL columns>")
        if not owns and prepared is None and not owner_sql:
            raise DatabaseError(f"the source's role does not own {where}", where="the source",
                                hint="a publication needs the tables' owner: connect as the role that owns them, or have it run"
                                     " the SQL pgidgen import --owner-sql prints (then REPLICATION and SELECT suffice)")
        if rls and not (bypass and bypass[0]) and (force_rls or not owns):
            raise DatabaseError(f"table {where} has row-level security, and the import's role does not bypass it", where="the source",
                                hint=f"it would copy only the rows the policies show it: ALTER ROLE <it> BYPASSRLS (as a superuser), or (as the owner)"
                                     f" CREATE POLICY pgidgen_import ON {where} FOR SELECT TO <it> USING (true) and ALTER TABLE {where} NO FORCE ROW LEVEL SECURITY")
        if name in routes:
            k = routes[name]
            tables.append(TablePlan(name, False, int(est), int(size), k.column, k.parent, k.parent_column, pks[name]))
            continue
        tables.append(TablePlan(name, True, int(est), int(size)))
        if ident != "f" and key not in (ident_cols or []):
            for rel, clause in source.execute(_IDENTITIES_SQL, {"rel": sql.Identifier(schema, name).as_string(source)}).fetchall():
                full_identity[str(rel)] = str(clause)
    for t in tables if not owner_sql else []:  # the rows are read when the import starts (the role may not read them yet)
        if t.parent:
            continue
        q = sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} IS NULL)").format(sql.Identifier(schema, t.name), sql.Identifier(key))
        row = source.execute(q).fetchone()
        if row and row[0]:
            raise InputError(f"{schema}.{t.name}.{key} holds NULLs", where="the source", hint="a row with no key has no shard: give those rows a key, or delete them")
    sequences = [r[0] for r in source.execute(
        "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = 'S' ORDER BY 1", (schema,))]
    oid = source.execute("SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()").fetchone()
    assert oid is not None
    m = read_map(config)
    if not m.ok or m.shard_count is None:
        raise ConfigError("the shard map is not whole: " + "; ".join(m.problems + list(m.unreachable.values())), hint="run pgidgen status, fix it, then import")
    targets = {n: sorted(s) for n, s in sorted(m.databases.items()) if s}
    if prepared is not None and not owner_sql and full_identity:
        raise ConflictError(f"the owner's preparation left {next(iter(full_identity))}'s replica identity without the key",
                            where="the source", hint="have the tables' owner run the SQL pgidgen import --owner-sql prints now, then import again")
    plan = ImportPlan(schema, key, m.shard_count, int(oid[0]), tables, targets, sorted(skip), sequences, follow=follow, ids=ids,
                      # a preparation made again keeps the identities the first one changed, as they were
                      full_identity={**(prepared or {}), **full_identity}, prepared=prepared is not None and not owner_sql)
    if ids is not None:
        _plan_ids(config, source, plan, prove_now=not owner_sql)
    plan.make_schema = [n for n in targets if _check_target(config, n, plan)]
    return plan


def _plan_ids(config: Config, source: psycopg.Connection[Any], plan: ImportPlan, *, prove_now: bool) -> None:
    """--ids next_id: the ID columns, then the collision proof (refused here, before anything is written)."""
    if plan.ids not in ID_SOURCES:
        raise InputError(f"--ids {plan.ids} is not known", hint=f"give --ids {' or '.join(ID_SOURCES)}, or leave it out to keep the source's defaults")
    found = id_columns(source, schema=plan.schema, key=plan.key, tables=[t.name for t in plan.tables])
    plan.id_columns, plan.identity = found.columns, found.identity
    plan.sequences = [s for s in plan.sequences if s not in found.identity_sequences]
    plan.id_bound = id_bound(config, list(plan.targets))
    if prove_now:
        prove(source, config.layout, schema=plan.schema, columns=plan.id_columns, bound=plan.id_bound)


def prepared_identity(source: psycopg.Connection[Any], schema: str) -> dict[str, str] | None:
    """None when the tables' owner has not prepared the source for this schema's import (prepared.py); else the
    replica identities the preparation set FULL, with the clauses that give theirs back."""
    if source.execute("SELECT pg_catalog.to_regclass(%s)", (f"{WORK_SCHEMA}.prepared",)).fetchone() == (None,):
        return None
    row = source.execute(sql.SQL("SELECT full_identity FROM {} WHERE schema_name = %s").format(sql.Identifier(WORK_SCHEMA, "prepared")),
                         (schema,)).fetchone()
    return None if row is None else {str(k): str(v) for k, v in row[0].items()}


def _check_prepared_for(source: psycopg.Connection[Any], schema: str, *, owner_sql: bool) -> None:
    """One schema at a time: the gate, journal and heartbeat a preparation makes serve one import. --owner-sql
    reads the tables' catalog entries by name, through the schema."""
    for table in ("prepared", "journal"):
        if source.execute("SELECT pg_catalog.to_regclass(%s)", (f"{WORK_SCHEMA}.{table}",)).fetchone() == (None,):
            continue
        other = source.execute(sql.SQL("SELECT schema_name FROM {} WHERE schema_name <> %s LIMIT 1").format(sql.Identifier(WORK_SCHEMA, table)),
                               (schema,)).fetchone()
        if other is not None:
            raise ConflictError(f"the source is prepared for an import of schema {other[0]}, not {schema}", where="the source",
                                hint=f"one schema at a time: finish or roll back that import, and have the owner take its preparation back"
                                     f" (pgidgen import --owner-sql --rollback --schema {other[0]})")
    row = source.execute("SELECT pg_catalog.has_schema_privilege(oid, 'USAGE') FROM pg_catalog.pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    if owner_sql and row is not None and not row[0]:
        raise DatabaseError(f"the source's role has no USAGE on schema {schema}", where="the source",
                            hint=f"GRANT USAGE ON SCHEMA {schema} TO <it> (as the owner; its preparation grants it too), then --owner-sql again")


def _check_server(source: psycopg.Connection[Any], *, own_schema: bool) -> None:
    """own_schema: pgidgen makes its schema on the source (else the owner's preparation made it, or will)."""
    version = source.info.server_version
    if version < 150000:
        raise ConfigError(f"the source runs PostgreSQL {version // 10000}", hint="import needs 15 or later (publication row filters)")
    wal = source.execute("SHOW wal_level").fetchone()
    if wal is None or wal[0] != "logical":
        raise ConfigError(f"the source runs with wal_level={wal[0] if wal else '?'}",
                          hint="set wal_level = logical in its postgresql.conf and restart it (changes are carried over by logical replication)")
    row = source.execute(
        "SELECT r.rolsuper OR r.rolreplication, pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')"
        " FROM pg_catalog.pg_roles r WHERE r.rolname = current_user").fetchone()
    if row is None or not row[0]:
        raise DatabaseError("the source's role lacks REPLICATION", where="the source", hint="ALTER ROLE <it> REPLICATION (as a superuser), or connect as one that has it")
    if not own_schema:
        return
    if not row[1]:
        raise DatabaseError("the source's role may not CREATE in its database", where="the source",
                            hint=f"GRANT CREATE ON DATABASE <it> TO <role> (import keeps its journal in a schema {WORK_SCHEMA} there),"
                                 " or have the tables' owner run the SQL pgidgen import --owner-sql prints")
    if source.execute("SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s", (WORK_SCHEMA,)).fetchone() is not None:
        raise ConflictError(f"the source has a schema {WORK_SCHEMA} but no import under way in this schema",
                            hint="an import of another schema, or a finished one: drop that schema if it is a leftover")


def _check_target(config: Config, name: str, plan: ImportPlan) -> bool:
    """Refuses what would clash on a target database; True when it lacks the schema (the staging step makes it)."""
    with connect(name, config.dsn(name), autocommit=True) as conn:
        try:
            row = conn.execute(
                "SELECT r.rolsuper OR pg_catalog.pg_has_role(r.oid, 'pg_create_subscription', 'MEMBER') IS TRUE"
                " FROM pg_catalog.pg_roles r WHERE r.rolname = current_user" if conn.info.server_version >= 160000 else
                "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").fetchone()
            if row is None or not row[0]:
                raise DatabaseError(f"database {name}'s role may not create subscriptions",
                                    hint="connect as a superuser, or (PostgreSQL 16+) GRANT pg_create_subscription TO <role>")
            if conn.execute("SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s", (WORK_SCHEMA,)).fetchone() is not None:
                raise ConflictError(f"database {name} has a schema {WORK_SCHEMA} left from an import",
                                    hint="run pgidgen import --rollback SOURCE if one is under way, else drop it")
            has_schema = conn.execute("SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s", (plan.schema,)).fetchone() is not None
            for t in plan.tables:
                if has_schema and conn.execute("SELECT pg_catalog.to_regclass(%s)", (sql.Identifier(plan.schema, t.name).as_string(conn),)).fetchone() != (None,):
                    raise ConflictError(f"database {name} has a table {plan.schema}.{t.name} already",
                                        hint="import stages rows in a table of the source's name there: rename or drop that one")
                parts = [sql.SQL("SELECT {}::int FROM {} WHERE EXISTS (SELECT FROM {})").format(sql.Literal(s), sql.Identifier(schema_name(s), t.name),
                                                                                           sql.Identifier(schema_name(s), t.name))
                         for s in plan.targets[name] if _exists(conn, schema_name(s), t.name)]
                if parts and conn.execute(sql.SQL(" UNION ALL ").join(parts) + sql.SQL(" LIMIT 1")).fetchone():
                    raise ConflictError(f"shards of database {name} hold rows of {t.name} already", hint="import fills empty shards only")
        except psycopg.Error as e:
            raise DatabaseError(f"database {name} failed while being checked: {pg_message(e)}") from None
    return not has_schema


def _exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute("SELECT pg_catalog.to_regclass(%s)", (sql.Identifier(schema, table).as_string(conn),)).fetchone()
    return row is not None and row[0] is not None
