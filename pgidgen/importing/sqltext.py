"""Where an import's SQL is rendered, as literal text: the engine runs these strings and --dry-run prints them.

The rows move by PostgreSQL's own logical replication. On each target database a staging table of the source
table's schema-qualified name is partitioned by the shard expression; its partitions are that database's shards'
tables (ATTACH PARTITION) and a catch-all for the rows of other databases' shards. A subscription per target
copies the tables at one snapshot and then carries the source's changes over, each row routed into its shard's
table by the partitioning. A publication per target filters rows by shard when the table's replica identity
holds the key (a row filter on other columns would make the source's UPDATEs fail); otherwise every row arrives
and other databases' rows land in the catch-all, dropped at the end.
"""
from __future__ import annotations

from psycopg import sql

from ..idgen import schema_name
from ..redact import scrub
from .source import WORK_SCHEMA, ImportPlan, TablePlan, shard_expr


def _s(c: sql.Composable) -> str:
    return c.as_string(None)


def _q(*parts: str) -> str:
    return _s(sql.Identifier(*parts))


def shard_filter(expr: str, shards: list[int]) -> str:
    """The shards as ranges (`expr BETWEEN 0 AND 999`): a row filter runs for every row, a list of 1000 shards
    would be searched for each."""
    runs: list[list[int]] = []
    for s in sorted(shards):
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{expr} = {a}" if a == b else f"{expr} BETWEEN {a} AND {b}" for a, b in runs]
    return " OR ".join(parts)


def journal_sql() -> str:
    """The source's journal (one row per imported schema) and heartbeat (a row per cutover, carried to every
    target to show it has caught up)."""
    w = _q(WORK_SCHEMA)
    return (
        f"CREATE SCHEMA {w};\n"
        f"CREATE TABLE {w}.journal (schema_name text PRIMARY KEY, step text NOT NULL, plan jsonb NOT NULL, dump text,"
        f" started_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());\n"
        f"CREATE TABLE {w}.heartbeat (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());\n"
    )


def staging_sql(plan: ImportPlan, database: str) -> str:
    """A target's staging tables, their partitions its shards' tables; one transaction."""
    shards = plan.targets[database]
    w = _q(WORK_SCHEMA)
    out = [f"CREATE SCHEMA {_q(plan.schema)};"] if database in plan.make_schema else []
    out += [f"CREATE SCHEMA {w};", f"CREATE TABLE {w}.heartbeat (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());"]
    expr = _s(shard_expr(plan.key, plan.shard_count))
    for t in plan.tables:
        if t.parent:  # a key-of table's: settle.staging_sql
            continue
        parent = _q(plan.schema, t.name)
        first = _q(schema_name(shards[0]), t.name)
        out.append(f"CREATE TABLE {parent} (LIKE {first}) PARTITION BY LIST ({expr});")
        out += [f"ALTER TABLE {parent} ATTACH PARTITION {_q(schema_name(s), t.name)} FOR VALUES IN ({s});" for s in shards]
        out.append(f"CREATE TABLE {_q(WORK_SCHEMA, t.name)} (LIKE {first} INCLUDING INDEXES);")
        out.append(f"ALTER TABLE {parent} ATTACH PARTITION {_q(WORK_SCHEMA, t.name)} DEFAULT;")
    return "\n".join(out) + "\n"


def publication_sql(plan: ImportPlan, database: str) -> str:
    expr = _s(shard_expr(plan.key, plan.shard_count))
    members = []
    for t in plan.tables:
        member = _q(plan.schema, t.name)
        if t.filtered:
            member += f" WHERE ({shard_filter(expr, plan.targets[database])})"
        members.append(member)
    members.append(_q(WORK_SCHEMA, "heartbeat"))
    # a partitioned table's changes as its own (not its partitions'): the staging table of its name routes them
    return f"CREATE PUBLICATION {_q(plan.slot(database))} FOR TABLE {', '.join(members)} WITH (publish_via_partition_root = true);\n"


def slot_sql(plan: ImportPlan, database: str) -> str:
    return f"SELECT pg_catalog.pg_create_logical_replication_slot({_s(sql.Literal(plan.slot(database)))}, 'pgoutput');\n"


def subscription_sql(plan: ImportPlan, database: str, source_conninfo: str, *, show: bool = False) -> str:
    """The slot is made beforehand on the source (a subscription that made its own would hang when source and
    target share a server); copy_data makes each table's copy at a snapshot of its own, caught up from there."""
    name = _s(sql.Literal(plan.slot(database)))
    conninfo = scrub(source_conninfo) if show else source_conninfo
    return (f"CREATE SUBSCRIPTION {_q(plan.slot(database))} CONNECTION {_s(sql.Literal(conninfo))}\n"
            f"    PUBLICATION {_q(plan.slot(database))} WITH (create_slot = false, slot_name = {name}, copy_data = true);\n")


def freeze_sql(plan: ImportPlan, token: str, where_to: str) -> str:
    """The cutover on the source, after its LOCK: from its commit every write to an imported table fails with a
    message saying where the rows went (a trigger, not a REVOKE: the owner would pass a REVOKE, and its
    'permission denied' would not say where the data is)."""
    w = _q(WORK_SCHEMA)
    rest = f" was imported into pgidgen's shards ({where_to}; shard = {plan.key} % {plan.shard_count}): write through the Router, not to this table"
    message = "%I.%I" + rest.replace("%", "%%")
    out = [
        f"CREATE FUNCTION {w}.refuse_write() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $body$\n"
        f"BEGIN\n    RAISE EXCEPTION USING ERRCODE = 'read_only_sql_transaction',"
        f" MESSAGE = pg_catalog.format({_s(sql.Literal(message))}, TG_TABLE_SCHEMA, TG_TABLE_NAME);\nEND\n$body$;",
    ]
    for t in plan.tables:
        out.append(f"CREATE TRIGGER pgidgen_imported BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {_q(plan.schema, t.name)}"
                   f" FOR EACH STATEMENT EXECUTE FUNCTION {w}.refuse_write();")
    out.append(f"INSERT INTO {w}.heartbeat (token) VALUES ({_s(sql.Literal(token))});")
    return "\n".join(out) + "\n"


def lock_sql(plan: ImportPlan) -> str:
    """Writes wait (reads go on) while the cutover transaction holds it; taken under a short lock_timeout."""
    return f"LOCK TABLE {', '.join(_q(plan.schema, t.name) for t in plan.tables)} IN SHARE ROW EXCLUSIVE MODE;\n"


def unfreeze_sql(plan: ImportPlan) -> str:
    return "".join(f"DROP TRIGGER IF EXISTS pgidgen_imported ON {_q(plan.schema, t.name)};\n" for t in plan.tables)


def disable_subscription_sql(name: str) -> str:
    """Before a subscription is dropped: its workers stopped, its slot detached (the engine drops the slots on the
    source itself; DROP SUBSCRIPTION goes there only for the slots of copies still running)."""
    q = _q(name)
    return f"ALTER SUBSCRIPTION {q} DISABLE;\nALTER SUBSCRIPTION {q} SET (slot_name = NONE);\n"


def detach_sql(plan: ImportPlan, database: str, attached: list[str] | None = None) -> list[str]:
    """The shards' tables detached from the staging tables (never dropped with their parent), a statement each.
    attached: partitions found attached (resume, rollback), else all the plan's."""
    out = []
    for t in plan.tables:
        parent = _q(plan.schema, t.name)
        for s in plan.targets[database] if not t.parent else []:
            part = _q(schema_name(s), t.name)
            if attached is None or part in attached:
                out.append(f"ALTER TABLE {parent} DETACH PARTITION {part};")
    return out


def drop_staging_sql(plan: ImportPlan, database: str) -> str:
    """Once the shards' tables are detached: the staging tables, their catch-alls and pgidgen's schema dropped."""
    out = [f"DROP TABLE IF EXISTS {_q(plan.schema, t.name)};" for t in plan.tables]
    out.append(f"DROP SCHEMA IF EXISTS {_q(WORK_SCHEMA)} CASCADE;")
    if database in plan.make_schema:
        out.append(f"DROP SCHEMA IF EXISTS {_q(plan.schema)};")
    return "\n".join(out) + "\n"


def unstage_sql(plan: ImportPlan, database: str, attached: list[str] | None = None) -> str:
    """The staging tables taken apart in one go (a rollback's, and --dry-run's)."""
    return "".join(d + "\n" for d in detach_sql(plan, database, attached)) + drop_staging_sql(plan, database)


def empty_shards_sql(plan: ImportPlan, database: str) -> str:
    """A rollback's: the shards' tables as the schema step left them, empty."""
    tables = [_q(schema_name(s), t.name) for t in plan.tables for s in plan.targets[database]]
    return f"TRUNCATE {', '.join(tables)};\n" if tables else ""


def sequences_sql(plan: ImportPlan, database: str, values: dict[str, int]) -> str:
    """Every shard's copy of a sequence continues from the source's value, so new rows' IDs do not repeat the
    imported rows' (is_called keeps a never-used sequence's first value); one statement."""
    rows = [f"({_s(sql.Literal(_q(schema_name(s), seq)))}, {int(value)})" for seq, value in values.items() for s in plan.targets[database]]
    if not rows:
        return ""
    return f"SELECT pg_catalog.setval(s.seq::pg_catalog.regclass, s.value) FROM (VALUES {', '.join(rows)}) AS s (seq, value);\n"


def ids_sql(plan: ImportPlan) -> str:
    """--ids next_id, appended to the source's dump (so the ledger records it with the tables it changes): each ID
    column's default becomes its shard's own next_id() (apply-ddl binds an unqualified next_id() to the shard it
    runs in); an identity column loses its identity first, and its sequence with it."""
    if not plan.id_columns:
        return ""
    out = ["", "-- pgidgen import --ids next_id"]
    for table, column in plan.id_columns.items():
        target = f"ALTER TABLE {_q(plan.schema, table)} ALTER COLUMN {_q(column)}"
        if table in plan.identity:
            out.append(f"{target} DROP IDENTITY;")
        out.append(f"{target} SET DEFAULT next_id();")
    return "\n".join(out) + "\n"


#: the settings under which a row's text form is the same on every server (the text checksum hashes it)
TEXT_FORM_SQL = ("SET LOCAL TimeZone = 'UTC';\nSET LOCAL DateStyle = 'ISO, MDY';\nSET LOCAL IntervalStyle = 'postgres';\n"
                 "SET LOCAL extra_float_digits = 1;\nSET LOCAL bytea_output = 'hex';\n")


def checksum_terms(alias: str, by_text: bool) -> str:
    """Rows' count and an order-free checksum: the sum of a 64-bit hash of each row. hash_record_extended hashes
    each column with its type's own hash function (those hash partitioning keeps stable across majors; dropped
    columns are skipped), three times cheaper than hashing the row's text; a table with a column type that has no
    hash function (json, point, ...) is hashed by its rows' text, in the same column order on both sides (the
    shards' tables come from the source's dump)."""
    row = f"pg_catalog.hashtextextended({alias}::text, 0)" if by_text else f"pg_catalog.hash_record_extended({alias}, 0)"
    return f"pg_catalog.count(*), COALESCE(pg_catalog.sum({row}), 0)"


def parents_of(plan: ImportPlan, t: TablePlan) -> list[TablePlan]:
    """A --key-of table's parents, nearest first, up to the one that holds the key (keyof.check_key_of refused a
    chain that comes back on itself)."""
    by_name = {x.name: x for x in plan.tables}
    out: list[TablePlan] = []
    while t.parent:
        t = by_name[t.parent]
        out.append(t)
    return out


def orphaned(plan: ImportPlan, t: TablePlan) -> str:
    """What a --key-of table's rows with no shard lack, for the refusal: the parent, or for a chain the table with
    the key at its end (a missing link anywhere up the chain leaves them with none)."""
    chain = [t.name] + [p.name for p in parents_of(plan, t)]
    return f"have no {t.parent} row" if len(chain) == 2 else f"reach no {chain[-1]} row (through {' -> '.join(chain)})"


def parent_join(plan: ImportPlan, t: TablePlan, row: str = "pgidgen_row") -> tuple[str, str]:
    """The joins from a --key-of table's row (alias row) up its parents to the one with the key, and that row's
    shard (NULL when a link is missing): (the LEFT JOINs' text, the shard expression)."""
    joins, child, link, n = [], row, t, plan.shard_count
    for i, p in enumerate(parents_of(plan, t)):
        alias = "pgidgen_parent" if i == 0 else f"pgidgen_parent_{i + 1}"
        joins.append(f" LEFT JOIN {_q(plan.schema, p.name)} AS {alias} ON {_q(alias, link.parent_column or '')} = {_q(child, link.via or '')}")
        child, link = alias, p
    return "".join(joins), f"((({_q(child, plan.key)} % {n}) + {n}) % {n})"


def checksum_sql(plan: ImportPlan, t: TablePlan, *, by_text: bool = False) -> str:
    """The source's side of the verify step: (shard, rows, checksum) per shard; a key-of table's rows by the shard
    of the parent that holds the key (a row with no parent: shard NULL)."""
    if not t.parent:
        expr = _s(shard_expr(plan.key, plan.shard_count))
        return f"SELECT {expr} AS shard, {checksum_terms('pgidgen_row', by_text)} FROM {_q(plan.schema, t.name)} AS pgidgen_row GROUP BY 1;\n"
    joins, expr = parent_join(plan, t)
    return f"SELECT {expr} AS shard, {checksum_terms('pgidgen_row', by_text)} FROM {_q(plan.schema, t.name)} AS pgidgen_row{joins} GROUP BY 1;\n"


def shard_checksums_sql(plan: ImportPlan, table: str, database: str, *, by_text: bool = False) -> str:
    """A target's side: (shard, rows, checksum) for each of its shards' tables."""
    return "\nUNION ALL ".join(f"SELECT {s}::int, {checksum_terms('pgidgen_row', by_text)} FROM {_q(schema_name(s), table)} AS pgidgen_row"
                               for s in plan.targets[database]) + ";\n"


def identity_full_sql(plan: ImportPlan) -> str:
    """The source tables whose replica identity lacks the key (a bigserial primary key) send whole old rows while
    the import runs: a target finds a DELETE's shard by the key in it (else the partitioning would route it to the
    catch-all, and the row would stay), and the publication can filter them by shard."""
    return "".join(f"ALTER TABLE {rel} REPLICA IDENTITY FULL;\n" for rel in plan.full_identity)


def identity_restore_sql(plan: ImportPlan) -> str:
    """Their replica identity as it was before the import."""
    return "".join(f"ALTER TABLE {rel} REPLICA IDENTITY {clause};\n" for rel, clause in plan.full_identity.items())

