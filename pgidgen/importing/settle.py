"""Where the rows of --key-of tables find their shard on each target ("settle"), rendered as text and run.

Such a table has no key column, so it cannot be partitioned by shard as the others are. On each target its staging
table, of the source's schema-qualified name (logical replication finds tables by that name), is a plain table
that receives every row of the source's table (the publication cannot filter it: a row filter sees only the row,
not its parent). A trigger on it, ENABLE REPLICA (it fires in the subscription's workers, which run as replica,
and not for pgidgen's own statements) once the copy is done (marking_sql), records the primary key of every row
the subscription writes in `pgidgen_import.<table>_dirty`. Settling takes the dirty keys, deletes those rows from the shards' tables where
they were put (`pgidgen_import.<table>_at` says which shard), and inserts them again from the staging table joined
to the parent's rows on this database (`pgidgen_import.<parent>_map`, map_sql), grouped by the parent's shard: a row lands in its parent's shard, and a row
whose parent lives on another database is left to that database. Each settle runs in one REPEATABLE READ
transaction, so the dirty keys it takes and the rows it reads are of one snapshot: a change the subscription
commits later stays dirty for the next settle.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql

from .. import locktable
from ..config import Config
from ..db import connect, each_database, execute_script, pg_message
from ..errors import DatabaseError, PgidgenError
from ..idgen import schema_name
from ..render import literal
from .source import WORK_SCHEMA, ImportPlan, TablePlan
from .sqltext import parents_of, shard_filter

T = TypeVar("T")


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
    """The --key-of tables, a parent before its children (a settle routes a child by its parent's map as the
    parent's settle left it)."""
    return sorted((t for t in plan.tables if t.parent), key=lambda t: len(parents_of(plan, t)))


def _children(plan: ImportPlan, t: TablePlan) -> list[TablePlan]:
    return [c for c in keyed_tables(plan) if c.parent == t.name]


def _taken(t: TablePlan) -> str:
    """The temporary table of the keys a settle took from t's dirty keys (its phases 1 to 3)."""
    return _q("pg_temp", f"pgidgen_d_{t.name}")


def _own_map_sql(plan: ImportPlan, t: TablePlan, *, whole: bool) -> str:
    """A routed parent's (likes, parent of comments) settle keeps its map: each row's primary key and the shard it
    routes to (every row, whichever database's shard), taken again for the rows it settles, whose children it then
    marks dirty: the children's settle takes them in the same phase, after it."""
    children = _children(plan, t)
    if not children:
        return ""
    assert t.via and len(t.pk) == 1
    own, parent_map, table, pk = _q(WORK_SCHEMA, f"{t.name}_map"), _q(WORK_SCHEMA, f"{t.parent}_map"), _q(plan.schema, t.name), _q(t.pk[0])
    fill = f"INSERT INTO {own} SELECT l.{pk}, p.shard FROM {table} l JOIN {parent_map} p ON p.v = l.{_q(t.via)}"
    if whole:
        return f"            TRUNCATE {own};\n            {fill};\n            ANALYZE {own};\n"
    taken = f"(SELECT {pk} FROM {_taken(t)})"
    return (f"            DELETE FROM {own} WHERE v IN {taken};\n            {fill} WHERE l.{pk} IN {taken};\n"
            + "".join(f"            INSERT INTO {_q(WORK_SCHEMA, f'{c.name}_dirty')} SELECT {_cols(c, 'c')} FROM {_q(plan.schema, c.name)} c"
                      f" WHERE c.{_q(c.via or '')} IN {taken};\n" for c in children))


#: A whole settle's room in the lock table (locktable.room: the locks its transaction may hold), for its settle
#: functions: a setting local to the transaction.
ROOM_SETTING = "pgidgen.settle_room"
#: Locks a shard whose foreign keys are dropped and added again holds to the commit (measured on 18: 16.7, against
#: 2.7 when its rows are checked one by one), and how many shards go between two counts of the locks held.
LOCKS_PER_SHARD = 17
CHECK_EVERY = 32


def staging_sql(plan: ImportPlan, database: str, t: TablePlan) -> str:
    """A key-of table's staging on one target: the table receiving every row, the dirty keys and their trigger,
    where each row was put, and the settle function (this database's shards written into it). A settle runs in
    three phases, each over every key-of table (settle_sql): 1, parents first, takes the dirty keys (a routed
    parent's map taken again and its children marked dirty); 2, children first, takes those rows out of the shards;
    3, parents first, puts them where they now go. So the shards' foreign keys from child to parent (the source's,
    dumped) hold at every statement: a like leaves its shard after its comments, and comes back before them. The
    first (whole) settle drops a shard's foreign keys from the table to its parent (or itself) while it fills it and
    adds them again after (as pg_get_constraintdef says, comments kept): one join each checks the rows, not one
    lookup per row. Left in place, checking each row: a NOT VALID one, one to another table, those of a shard with a
    deferred check, and those of the shards left once the transaction's room in the lock table (locktable.room) is
    used."""
    assert t.parent and t.via and t.parent_column
    first = _q(schema_name(plan.targets[database][0]), t.name)
    table, dirty, at = _q(plan.schema, t.name), _q(WORK_SCHEMA, f"{t.name}_dirty"), _q(WORK_SCHEMA, f"{t.name}_at")
    mark, settle = _q(WORK_SCHEMA, f"dirty_{t.name}"), _q(WORK_SCHEMA, f"settle_{t.name}")
    pk, new, old = _cols(t), _cols(t, "NEW").replace('"NEW".', "NEW."), _cols(t, "OLD").replace('"OLD".', "OLD.")
    shard = _q("p", "shard")
    here = shard_filter(shard, plan.targets[database])
    d = _taken(t)
    into = _fmt(f"INSERT INTO %I.{_q(t.name)} SELECT (x.r).* FROM pg_temp.pgidgen_r x WHERE x.shard = $1")
    out_of = _fmt(f"DELETE FROM %I.{_q(t.name)} WHERE ({pk}) IN (SELECT {pk} FROM {d})")
    empty = _fmt(f"DELETE FROM %I.{_q(t.name)}")  # not TRUNCATE: a table another refers to by foreign key cannot be truncated alone
    parent_map = _q(WORK_SCHEMA, f"{t.parent}_map")
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
ALTER TABLE {table} DISABLE TRIGGER pgidgen_dirty;
CREATE FUNCTION {settle}(whole boolean, phase int) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog AS $body$
DECLARE
    s int;
    n bigint;
    k name;
    fks name[];
    defs text[];
    notes text[];
    i int;
    j int := 0;
    room bigint;
    fast boolean := false;
    rel regclass;
    par regclass;
BEGIN
    IF phase = 1 THEN  -- the keys taken (whole: every row, after the copy; again on a resume)
        IF whole THEN
            DELETE FROM {dirty};
{_own_map_sql(plan, t, whole=True) or "            NULL;"}
        ELSE
            CREATE TEMP TABLE {d.removeprefix('"pg_temp".')} AS SELECT {pk} FROM {table} WITH NO DATA;
            WITH taken AS (DELETE FROM {dirty} RETURNING {pk}) INSERT INTO {d} SELECT {pk} FROM taken;
            ANALYZE {d};
{_own_map_sql(plan, t, whole=False)}        END IF;
        RETURN 0;
    END IF;
    IF phase = 2 THEN  -- their rows out of the shards they were put in (whole: every row placed before)
        IF whole THEN
            FOR s IN SELECT DISTINCT a.shard FROM {at} a LOOP
                EXECUTE pg_catalog.format({empty}, 'shard_' || s);
            END LOOP;
            TRUNCATE {at};
        ELSE
            FOR s IN SELECT DISTINCT a.shard FROM {at} a WHERE ({_cols(t, "a")}) IN (SELECT {pk} FROM {d}) LOOP
                EXECUTE pg_catalog.format({out_of}, 'shard_' || s);
            END LOOP;
            DELETE FROM {at} a WHERE ({_cols(t, "a")}) IN (SELECT {pk} FROM {d});
        END IF;
        RETURN 0;
    END IF;
    IF whole THEN  -- phase 3: the rows into the shards of their parents, those on this database
        CREATE TEMP TABLE pgidgen_r AS SELECT {shard} AS shard, l AS r FROM {table} l
            JOIN {parent_map} p ON p.v = l.{_q(t.via)} WHERE ({here}) ORDER BY 1;
        GET DIAGNOSTICS n = ROW_COUNT;
    ELSE
        CREATE TEMP TABLE pgidgen_r AS SELECT {shard} AS shard, l AS r FROM {table} l
            JOIN {parent_map} p ON p.v = l.{_q(t.via)}
            WHERE ({_cols(t, "l")}) IN (SELECT {pk} FROM {d}) AND ({here}) ORDER BY 1;
        GET DIAGNOSTICS n = ROW_COUNT;
        DROP TABLE {d};
    END IF;
    CREATE INDEX ON pg_temp.pgidgen_r (shard);
    ANALYZE pg_temp.pgidgen_r;
    IF whole THEN  -- every row's place at once (phase 2 emptied it): its primary key built after the rows
        SELECT c.conname INTO k FROM pg_catalog.pg_constraint c WHERE c.conrelid = {literal(at)}::pg_catalog.regclass AND c.contype = 'p';
        EXECUTE pg_catalog.format('ALTER TABLE %s DROP CONSTRAINT %I', {literal(at)}, k);
    END IF;
    INSERT INTO {at} SELECT {", ".join(f"(x.r).{_q(c)}" for c in t.pk)}, x.shard FROM pg_temp.pgidgen_r x;
    IF whole THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s)', {literal(at)}, k, {literal(pk)});
        -- the locks this transaction may hold (locktable.room, given by _settle_once)
        room := coalesce(nullif(pg_catalog.current_setting({literal(ROOM_SETTING)}, true), ''), '0')::bigint;
    END IF;
    FOR s IN SELECT DISTINCT x.shard FROM pg_temp.pgidgen_r x LOOP
        fks := NULL;
        IF whole AND j % {CHECK_EVERY} = 0 THEN  -- the next shards' drops and adds fit in it
            SELECT count(*) + {CHECK_EVERY * LOCKS_PER_SHARD} < room INTO fast FROM pg_catalog.pg_locks
             WHERE pid = pg_catalog.pg_backend_pid() AND NOT fastpath;
        END IF;
        j := j + 1;
        IF whole AND fast THEN  -- the shard's foreign keys from this table checked after its rows, one join each, not per row
            rel := pg_catalog.format('%I.%I', 'shard_' || s, {literal(t.name)})::pg_catalog.regclass;
            par := pg_catalog.format('%I.%I', 'shard_' || s, {literal(t.parent)})::pg_catalog.regclass;
            SELECT pg_catalog.array_agg(c.conname ORDER BY c.conname),
                   pg_catalog.array_agg(pg_catalog.pg_get_constraintdef(c.oid) ORDER BY c.conname),
                   pg_catalog.array_agg(pg_catalog.obj_description(c.oid, 'pg_constraint') ORDER BY c.conname)
              INTO fks, defs, notes FROM pg_catalog.pg_constraint c
             WHERE c.conrelid = rel AND c.contype = 'f' AND c.conparentid = 0
               AND c.convalidated  -- a NOT VALID one stays, checking each row (added again, it would check none)
               AND c.confrelid IN (rel, par)  -- tables no other session writes meanwhile (hold_sql; the shard's parent)
               AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger g WHERE g.tgrelid IN (rel, par) AND g.tgdeferrable);
               -- a deferred check pending on either table would make the ALTER TABLE fail
            FOR i IN 1 .. coalesce(pg_catalog.array_length(fks, 1), 0) LOOP
                EXECUTE pg_catalog.format('ALTER TABLE %s DROP CONSTRAINT %I', rel, fks[i]);
            END LOOP;
        END IF;
        EXECUTE pg_catalog.format({into}, 'shard_' || s) USING s;
        FOR i IN 1 .. coalesce(pg_catalog.array_length(fks, 1), 0) LOOP  -- as they were, comments too
            EXECUTE pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT %I %s', rel, fks[i], defs[i]);
            IF notes[i] IS NOT NULL THEN
                EXECUTE pg_catalog.format('COMMENT ON CONSTRAINT %I ON %s IS %L', fks[i], rel, notes[i]);
            END IF;
        END LOOP;
    END LOOP;
    DROP TABLE pg_temp.pgidgen_r;
    RETURN n;
END
$body$;
"""


def parents(plan: ImportPlan) -> dict[str, str]:
    """The tables --key-of tables route through -> the column their children refer to."""
    return {t.parent: t.parent_column for t in keyed_tables(plan) if t.parent and t.parent_column}


def marking_sql(plan: ImportPlan) -> list[str]:
    """The dirty keys' triggers enabled (for the subscription's workers), once the copy is done: the first settle
    routes every row (whole) in a snapshot taken after this commits, so a row the copy or the changes before it
    wrote needs no mark, and the copy makes no trigger call per row for rows that settle takes anyway."""
    return [f"ALTER TABLE {_q(plan.schema, t.name)} ENABLE REPLICA TRIGGER pgidgen_dirty;\n" for t in keyed_tables(plan)]


def map_sql(plan: ImportPlan) -> str:
    """Where each parent row's children go, on one target: `pgidgen_import.<parent>_map` (the referred value and the
    parent's shard), kept by a trigger on the parent's staging table (ENABLE REPLICA: in the subscription's
    workers), filled in the same transaction (the trigger's lock holds the workers off meanwhile). Made once the
    copy is done, so the copy does not fire it. The settle finds a row's parent there by one index lookup, where
    the parent's staging table (a partition per shard, none of which its key can pick) takes one per partition.
    A parent row that moves to another shard (its key changed: the subscription deletes it from one partition and
    inserts it into another) or comes or goes marks its children dirty: the next settle takes them to its shard.
    An UPDATE within its partition leaves its shard, and its children, where they are."""
    out = []
    routed = {t.name for t in keyed_tables(plan)}
    for parent, column in parents(plan).items():
        m, root, fn = _q(WORK_SCHEMA, f"{parent}_map"), _q(plan.schema, parent), _q(WORK_SCHEMA, f"map_{parent}")
        if parent in routed:  # a routed parent's map: kept by its settle (_own_map_sql), filled by the first
            out.append(f"CREATE TABLE {m} AS SELECT {_q(column)} AS v, 0::int AS shard FROM {root} WITH NO DATA;\nALTER TABLE {m} ADD PRIMARY KEY (v);\n")
            continue
        shard = _shard_of(plan, "NEW").replace('"NEW".', "NEW.")

        def follow(row: str, parent: str = parent, column: str = column) -> str:  # its children, settled again
            return "".join(f"        INSERT INTO {_q(WORK_SCHEMA, f'{c.name}_dirty')} SELECT {_cols(c)} FROM {_q(plan.schema, c.name)}"
                           f" WHERE {_q(c.via or '')} = {row}.{_q(column)};\n" for c in keyed_tables(plan) if c.parent == parent)
        out.append(f"""CREATE TABLE {m} AS SELECT {_q(column)} AS v, 0::int AS shard FROM {root} WITH NO DATA;
ALTER TABLE {m} ADD PRIMARY KEY (v);
CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $body$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.{_q(column)} IS NOT DISTINCT FROM NEW.{_q(column)} THEN RETURN NULL; END IF;  -- its partition, its shard
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM {m} WHERE v = OLD.{_q(column)};
{follow("OLD")}    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO {m} VALUES (NEW.{_q(column)}, {shard}) ON CONFLICT (v) DO UPDATE SET shard = EXCLUDED.shard;
{follow("NEW")}    END IF;
    RETURN NULL;
END
$body$;
CREATE TRIGGER pgidgen_map AFTER INSERT OR UPDATE OR DELETE ON {root} FOR EACH ROW EXECUTE FUNCTION {fn}();
ALTER TABLE {root} ENABLE REPLICA TRIGGER pgidgen_map;
INSERT INTO {m} SELECT p.{_q(column)}, {_shard_of(plan, "p")} FROM {root} p;
ANALYZE {m};
""")
    return "".join(out)


def make_maps(config: Config, plan: ImportPlan) -> None:
    """map_sql on every target that lacks it (a resumed import made it already), then marking_sql, the databases
    in parallel."""
    if not parents(plan):
        return

    def work(name: str) -> None:
        first = next(iter(parents(plan)))

        def script(conn: psycopg.Connection[Any]) -> str:
            made = conn.execute("SELECT pg_catalog.to_regclass(%s)", (_q(WORK_SCHEMA, f"{first}_map"),)).fetchone() != (None,)
            return "" if made else map_sql(plan)
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                under_writes(conn, script)
                for text in marking_sql(plan):  # a transaction each (under_writes); again on a resume
                    under_writes(conn, text)
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while mapping the parents' rows: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --resume (or --rollback)") from None
    for outcome in each_database(list(plan.targets), work).values():
        if isinstance(outcome, PgidgenError):
            raise outcome


def staging_all_sql(plan: ImportPlan, database: str) -> str:
    """Every key-of table's staging on one target, run after sqltext.staging_sql in its transaction."""
    return "".join(staging_sql(plan, database, t) for t in keyed_tables(plan))


def hold_sql(plan: ImportPlan) -> str:
    """A settle's first statements, before its snapshot (a LOCK takes none): the staging tables of the parents with
    the key held against the subscription's writes until it commits. A routed row's foreign key to its parent in
    the shard is checked FOR KEY SHARE on the parent's latest row; a parent the subscription moved after the
    snapshot (a photo to another user) would fail the settle in REPEATABLE READ, again and again under a busy
    writer of parents (measured: 20 tries in 14 s, each failed). Under a lock_timeout below deadlock_timeout (1 s
    by default): a settle that waits with part of the tables held gives up (and is tried again) before the
    subscription's worker, waiting on it, would be the one a deadlock cancels."""
    held = [_q(plan.schema, t.name) for t in plan.tables if not t.parent and t.name in parents(plan)]
    return (f"SET LOCAL lock_timeout = '{HOLD_TIMEOUT_MS}ms';\nLOCK TABLE ONLY {', '.join(held)} IN SHARE MODE;\nRESET lock_timeout;\n"
            if held else "")


def _phases(plan: ImportPlan) -> list[tuple[TablePlan, int]]:
    """The settle's calls: phase 1 and 3 parents first, phase 2 children first (staging_sql)."""
    tables = keyed_tables(plan)
    return [(t, 1) for t in tables] + [(t, 2) for t in reversed(tables)] + [(t, 3) for t in tables]


def settle_sql(plan: ImportPlan, *, whole: bool) -> str:
    """One database's settle: every key-of table in one snapshot (whole: every row, after the copy), in phases."""
    w = "true" if whole else "false"
    calls = "".join(f"SELECT {_q(WORK_SCHEMA, f'settle_{t.name}')}({w}, {phase});\n" for t, phase in _phases(plan))
    return f"BEGIN ISOLATION LEVEL REPEATABLE READ;\n{hold_sql(plan)}{calls}COMMIT;\n" if calls else ""


def settle(config: Config, plan: ImportPlan, *, whole: bool = False) -> dict[str, int]:
    """Runs settle_sql on every target, the databases in parallel; rows routed per database."""
    if not keyed_tables(plan):
        return {}

    rooms = _rooms(config, plan) if whole else {}

    def work(name: str) -> int:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                return _settle_one(conn, plan, whole, rooms.get(name, 0))
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while routing rows of {', '.join(t.name for t in keyed_tables(plan))}: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --resume (or --rollback)") from None
    done = each_database(list(plan.targets), work)
    for outcome in done.values():
        if isinstance(outcome, PgidgenError):
            raise outcome
    return {n: int(v) for n, v in done.items() if not isinstance(v, PgidgenError)}


def _rooms(config: Config, plan: ImportPlan) -> dict[str, int]:
    """Each target's room in its server's lock table for a whole settle (locktable.room: HEADROOM of what is free,
    split between the targets on one server, which settle at once)."""
    budgets = {}
    for name in plan.targets:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            budgets[name] = locktable.read_budget(conn)
    shared = locktable.sharing(budgets)
    return {name: locktable.room(b, shared[name]) for name, b in budgets.items()}


#: how often a settle that a concurrent change made fail (below) is run again, the waits between growing
RETRIES = 20
#: hold_sql's lock_timeout: below deadlock_timeout's default, 1 s
HOLD_TIMEOUT_MS = 500


#: what a try under the subscription's writes may meet, and is tried again for
_RETRIED = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)


def _retried(attempt: Callable[[], T]) -> T:
    """attempt() again, up to RETRIES times, while it fails with one of _RETRIED; the waits between growing."""
    for n in range(RETRIES):
        try:
            return attempt()
        except _RETRIED:
            if n == RETRIES - 1:
                raise
            time.sleep(min(1.0, 0.02 * 2 ** n))
    raise AssertionError("unreachable")


def under_writes(conn: psycopg.Connection[Any], script: str | Callable[[psycopg.Connection[Any]], str]) -> None:
    """script (or script(conn)'s text) run in one transaction that takes locks on tables the subscription writes
    (triggers made or enabled), under HOLD_TIMEOUT_MS' lock_timeout; tried again on a lock timeout or a deadlock
    (its locks taken one statement after another, while the subscription's worker takes its own: seen, 40P01
    arming the verification under a writer)."""
    def attempt() -> None:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{HOLD_TIMEOUT_MS}ms'".encode())
            execute_script(conn, script if isinstance(script, str) else script(conn))
    _retried(attempt)


def _settle_one(conn: psycopg.Connection[Any], plan: ImportPlan, whole: bool, room: int) -> int:
    """A settle, run again should a change committed after its snapshot fail it (40001: hold_sql keeps the
    subscription's writes to the tables with the key off; a deadlock, 40P01, is retried too). A failed try leaves
    nothing: its dirty keys are taken again by the next, which sees the change."""
    return _retried(lambda: _settle_once(conn, plan, whole, room))


def _settle_once(conn: psycopg.Connection[Any], plan: ImportPlan, whole: bool, room: int) -> int:
    with conn.transaction():
        conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if hold_sql(plan):
            execute_script(conn, hold_sql(plan))
        if whole:  # after hold_sql: a query takes the snapshot
            conn.execute("SELECT pg_catalog.set_config(%s, %s, true)", (ROOM_SETTING, str(room)))
        total = 0
        for t, phase in _phases(plan):
            row = conn.execute(sql.SQL("SELECT {}(%s, %s)").format(sql.Identifier(WORK_SCHEMA, f"settle_{t.name}")), (whole, phase)).fetchone()
            total += int(row[0]) if row and row[0] is not None else 0
        return total


def catch_up(config: Config, plan: ImportPlan, *, rounds: int = 5, small: int = 1000) -> None:
    """Before the cutover's pause: settle until a round routes few rows, so the pause settles only the last ones."""
    for _ in range(rounds):
        if all(n < small for n in settle(config, plan).values()):
            return


