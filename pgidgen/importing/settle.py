"""Where the rows of --key-of tables find their shard on each target ("settle"), rendered as text and run.

Such a table has no key column, so it cannot be partitioned by shard as the others are. On each target its staging
table, of the source's schema-qualified name (logical replication finds tables by that name), is a plain table
that receives every row of the source's table (the publication cannot filter it: a row filter sees only the row,
not its parent). A trigger on it, ENABLE REPLICA (it fires in the subscription's workers, which run as replica,
and not for pgidgen's own statements), records the primary key of every row the subscription writes in
`pgidgen_import.<table>_dirty`. Settling takes the dirty keys, deletes those rows from the shards' tables where
they were put (`pgidgen_import.<table>_at` says which shard), and inserts them again from the staging table joined
to the parent's rows on this database, grouped by the parent's shard: a row lands in its parent's shard, and a row
whose parent lives on another database is left to that database. Each settle runs in one REPEATABLE READ
transaction, so the dirty keys it takes and the rows it reads are of one snapshot: a change the subscription
commits later stays dirty for the next settle.
"""
from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..config import Config
from ..db import connect, each_database, pg_message
from ..errors import DatabaseError, PgidgenError
from ..idgen import schema_name
from .source import WORK_SCHEMA, ImportPlan, TablePlan
from .sqltext import shard_filter


def _s(c: sql.Composable) -> str:
    return c.as_string(None)


def _q(*parts: str) -> str:
    return _s(sql.Identifier(*parts))


def _shard_of(plan: ImportPlan, alias: str) -> str:
    """The Router's rule on the parent's key (source.shard_expr, qualified by the parent's alias)."""
    n = sql.Literal(plan.shard_count)
    return _s(sql.SQL("((({} % {}) + {}) % {})").format(sql.Identifier(alias, plan.key), n, n, n))


def _cols(t: TablePlan, alias: str = "") -> str:
    return ", ".join(_q(alias, c) if alias else _q(c) for c in t.pk)


def _fmt(text: str) -> str:
    """A format() string for the settle function: its own % doubled (the shard's schema goes through %I, the rest
    is quoted already)."""
    return _s(sql.Literal(text.replace("%", "%%").replace("%%I", "%I")))


def keyed_tables(plan: ImportPlan) -> list[TablePlan]:
    return [t for t in plan.tables if t.parent]


def staging_sql(plan: ImportPlan, database: str, t: TablePlan) -> str:
    """A key-of table's staging on one target: the table receiving every row, the dirty keys and their trigger,
    where each row was put, and the settle function (this database's shards written into it)."""
    assert t.parent and t.via and t.parent_column
    first = _q(schema_name(plan.targets[database][0]), t.name)
    table, dirty, at = _q(plan.schema, t.name), _q(WORK_SCHEMA, f"{t.name}_dirty"), _q(WORK_SCHEMA, f"{t.name}_at")
    mark, settle = _q(WORK_SCHEMA, f"dirty_{t.name}"), _q(WORK_SCHEMA, f"settle_{t.name}")
    pk, new, old = _cols(t), _cols(t, "NEW").replace('"NEW".', "NEW."), _cols(t, "OLD").replace('"OLD".', "OLD.")
    shard = _shard_of(plan, "p")
    here = shard_filter(shard, plan.targets[database])
    into = _fmt(f"INSERT INTO %I.{_q(t.name)} SELECT (x.r).* FROM pg_temp.pgidgen_r x WHERE x.shard = $1")
    out_of = _fmt(f"DELETE FROM %I.{_q(t.name)} WHERE ({pk}) IN (SELECT {pk} FROM pg_temp.pgidgen_d)")
    return f"""CREATE TABLE {table} (LIKE {first} INCLUDING INDEXES);
CREATE TABLE {dirty} AS SELECT {pk} FROM {table} WITH NO DATA;
CREATE TABLE {at} AS SELECT {pk}, 0::int AS shard FROM {table} WITH NO DATA;
ALTER TABLE {at} ADD PRIMARY KEY ({pk});
CREATE FUNCTION {mark}() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $body$
BEGIN
    IF TG_OP <> 'INSERT' THEN INSERT INTO {dirty} VALUES ({old}); END IF;
    IF TG_OP <> 'DELETE' THEN INSERT INTO {dirty} VALUES ({new}); END IF;
    RETURN NULL;
END
$body$;
CREATE TRIGGER pgidgen_dirty AFTER INSERT OR UPDATE OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {mark}();
ALTER TABLE {table} ENABLE REPLICA TRIGGER pgidgen_dirty;
CREATE FUNCTION {settle}(whole boolean) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog AS $body$
DECLARE
    s int;
    n bigint;
BEGIN
    CREATE TEMP TABLE pgidgen_d AS SELECT {pk} FROM {table} WITH NO DATA;
    IF whole THEN
        DELETE FROM {dirty};
        INSERT INTO pg_temp.pgidgen_d SELECT {pk} FROM {table};
    ELSE
        WITH taken AS (DELETE FROM {dirty} RETURNING {pk}) INSERT INTO pg_temp.pgidgen_d SELECT {pk} FROM taken;
    END IF;
    ANALYZE pg_temp.pgidgen_d;
    FOR s IN SELECT DISTINCT a.shard FROM {at} a WHERE ({_cols(t, "a")}) IN (SELECT {pk} FROM pg_temp.pgidgen_d) LOOP
        EXECUTE pg_catalog.format({out_of}, 'shard_' || s);
    END LOOP;
    DELETE FROM {at} a WHERE ({_cols(t, "a")}) IN (SELECT {pk} FROM pg_temp.pgidgen_d);
    CREATE TEMP TABLE pgidgen_r AS SELECT {shard} AS shard, l AS r FROM {table} l
        JOIN {_q(plan.schema, t.parent)} p ON p.{_q(t.parent_column)} = l.{_q(t.via)}
        WHERE ({_cols(t, "l")}) IN (SELECT {pk} FROM pg_temp.pgidgen_d) AND ({here}) ORDER BY 1;
    GET DIAGNOSTICS n = ROW_COUNT;
    CREATE INDEX ON pg_temp.pgidgen_r (shard);
    ANALYZE pg_temp.pgidgen_r;
    INSERT INTO {at} SELECT {", ".join(f"(x.r).{_q(c)}" for c in t.pk)}, x.shard FROM pg_temp.pgidgen_r x;
    FOR s IN SELECT DISTINCT x.shard FROM pg_temp.pgidgen_r x LOOP
        EXECUTE pg_catalog.format({into}, 'shard_' || s) USING s;
    END LOOP;
    DROP TABLE pg_temp.pgidgen_d, pg_temp.pgidgen_r;
    RETURN n;
END
$body$;
"""


def staging_all_sql(plan: ImportPlan, database: str) -> str:
    """Every key-of table's staging on one target, run after sqltext.staging_sql in its transaction."""
    return "".join(staging_sql(plan, database, t) for t in keyed_tables(plan))


def settle_sql(plan: ImportPlan, *, whole: bool) -> str:
    """One database's settle: every key-of table in one snapshot (whole: every row, after the copy)."""
    calls = "".join(f"SELECT {_q(WORK_SCHEMA, f'settle_{t.name}')}({'true' if whole else 'false'});\n" for t in keyed_tables(plan))
    return f"BEGIN ISOLATION LEVEL REPEATABLE READ;\n{calls}COMMIT;\n" if calls else ""


def settle(config: Config, plan: ImportPlan, *, whole: bool = False) -> dict[str, int]:
    """Runs settle_sql on every target, the databases in parallel; rows routed per database."""
    if not keyed_tables(plan):
        return {}

    def work(name: str) -> int:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                return _settle_one(conn, plan, whole)
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while routing rows of {', '.join(t.name for t in keyed_tables(plan))}: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --resume (or --rollback)") from None
    done = each_database(list(plan.targets), work)
    for outcome in done.values():
        if isinstance(outcome, PgidgenError):
            raise outcome
    return {n: int(v) for n, v in done.items() if not isinstance(v, PgidgenError)}


def _settle_one(conn: psycopg.Connection[Any], plan: ImportPlan, whole: bool) -> int:
    with conn.transaction():
        conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        total = 0
        for t in keyed_tables(plan):
            row = conn.execute(sql.SQL("SELECT {}(%s)").format(sql.Identifier(WORK_SCHEMA, f"settle_{t.name}")), (whole,)).fetchone()
            total += int(row[0]) if row and row[0] is not None else 0
        return total


def catch_up(config: Config, plan: ImportPlan, *, rounds: int = 5, small: int = 1000) -> None:
    """Before the cutover's pause: settle until a round routes few rows, so the pause settles only the last ones."""
    for _ in range(rounds):
        if all(n < small for n in settle(config, plan).values()):
            return


