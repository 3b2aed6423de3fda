"""Where IDs are made: rendering the catalog and each shard's schema, sequences and next_id().

Schema `shard_N` holds the user's tables and pgidgen's objects: sequences `pgidgen_counter` and `pgidgen_offset`
and the function `next_id()`, whose parameters' defaults are the fast path's reads (call it without arguments).
With the default generator, "shared", next_id() is a SQL function the planner inlines into the calling statement:
it hands the shard number and those reads to `pgidgen.next_id_of()`, whose slow path is
`pgidgen.locked_next_id(N)` (SECURITY DEFINER, so application roles need no UPDATE on the sequences), so a
session holds one set of PL/pgSQL plans for every shard. With "seqlock" (shards made before it) each shard has
both functions of its own, `next_id()` and `pgidgen_locked_next_id()`, in PL/pgSQL. Before installing a generator on a database, init (and move-shard, on a database without a
catalog) checks that the server evaluates function defaults in order (`check_argument_order`). The generator
state (the largest ID handed out) is `pgidgen.last_id(N)`; `pgidgen.advance_generator(N, id)` makes every future
ID of shard N greater than `id` (what a shard move carries across). docs/next_id.md has the argument.

Advisory locks, all of class LOCK_CLASS: object N is shard N's generator (shard 0 is object 0); -1 is init; -4 is
sharded DDL (apply-ddl holds it session-level on every configured database, in name order, while it plans and
applies; init takes it transaction-level before replaying the ledger for new shards; a move takes it shared while
it marks a shard 'moving', so apply-ddl and a move never overlap); -16777216 - N (move.journal.move_lock_key) is
"shard N is being moved", held by the mover on the source for the whole move. CATALOG_REVISION is recorded as a
comment on pgidgen.min_id(): init, move-shard and rebalance re-run an older catalog's SQL to bring it up.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from . import __version__
from .errors import ConfigError, DatabaseError
from .layout import Layout, iso_ms
from .render import ident, literal, render, static_sql

#: Advisory-lock class of pgidgen's locks ('pgid'); the object id is the shard number (or INIT_LOCK for init).
LOCK_CLASS = 1885825380
#: init's object in that class: not 0, which is shard 0's generator lock (its slow path would wait for init).
INIT_LOCK = -1
#: Held (session-level) on every configured database for a whole init run, so that two inits of one deployment,
#: even on different databases, plan one after the other: each sees the shards the other made.
INIT_RUN_LOCK = -2
#: A write's claim of shard N (pgidgen.claim_shard, sql/catalog.sql) holds (LOCK_CLASS, CLAIM_LOCK_BASE - N) shared
#: until its transaction ends; a move's cutover takes it exclusively before it retires the shard.
CLAIM_LOCK_BASE = -1073741824
#: The generator templates; the layout and shard number are rendered into them. "shared" keeps the work in the
#: catalog's pgidgen.next_id_of() and pgidgen.locked_next_id() (generators/shared_catalog.sql.j2), which every
#: catalog has: seqlock's PL/pgSQL in each shard left 18 cached plans per shard in every session that wrote to it
#: (35,000 and 540 MB for 2000 shards), each checked by PostgreSQL for every relation invalidated, so an
#: application connection stalled for seconds while a migration or autovacuum ran (docs/next_id.md, "Cost").
GENERATORS = {"seqlock": "generators/seqlock.sql.j2", "shared": "generators/shared.sql.j2"}
DEFAULT_GENERATOR = "shared"
#: When next_id()'s slow path finds a busy shard's time field just behind the clock (by one millisecond: the shard
#: drew IDs in every millisecond of its time field), it raises it to LEAD_MS ahead of the clock rather than to the
#: clock, so the generator lock is taken once per LEAD_MS + 1 ms of activity instead of every millisecond
#: (docs/next_id.md, "Time"). Further behind (a pause of 2 ms or more), it raises it to the clock.
LEAD_MS = 4


def schema_name(shard: int) -> str:
    return f"shard_{shard}"


#: The catalog's SQL (catalog.sql and catalog_functions) as of this version, recorded in a comment on
#: pgidgen.min_id(): init and move-shard bring an older catalog up to it (all of it is safe to run again), so fixes
#: to the functions reach databases initialised before them. 1: no comment (before the first fix needing it);
#: 3: advance_generator's message for a negative ID; 4: claim_shard's advisory claim lock; 5: pgidgen.claim, the
#: claim Routers CALL; 6: decode, shard_of, id_time and id_sequence refuse (22003) a bigint that is not an ID of
#: the layout (negative, or wider than its fields) instead of masking it into another ID's fields; 7: pgidgen.claim
#: remembers a shard it found served until pgidgen.map_version moves, and claim_fence makes a change that takes a
#: shard out of service take its claim lock (what keeps that true); 8: pgidgen.shard_for_key, the Router's
#: key -> shard rule in SQL; 9: pgidgen.next_id_of and pgidgen.locked_next_id, the shared generator's functions;
#: 10: pgidgen.advance_generators, a batch's generators in one call (a move's activate).
CATALOG_REVISION = 10
#: The installed catalog's revision, as a SQL expression (1 when the comment is missing).
CATALOG_REVISION_SQL = ("coalesce(substring(obj_description(to_regprocedure('pgidgen.min_id(timestamptz)'), 'pg_proc')"
                        " FROM 'revision ([0-9]+)')::int, 1)")


def render_catalog(layout: Layout, *, shard_count: int, generator: str = DEFAULT_GENERATOR) -> str:
    """The catalog schema, its layout row and the layout-specific SQL helpers."""
    row = (
        "INSERT INTO pgidgen.layout (epoch_ms, time_bits, shard_bits, sequence_bits, shard_count, generator, pgidgen_version)\n"
        f"VALUES ({layout.epoch_ms}, {layout.time_bits}, {layout.shard_bits}, {layout.sequence_bits}, {shard_count}, "
        f"{literal(generator)}, {literal(__version__)}) ON CONFLICT (singleton) DO NOTHING;\n"
    )
    runs_out = iso_ms(layout.epoch_ms + (1 << layout.time_bits))
    return static_sql("catalog.sql") + "\n" + row + render(
        "catalog_functions.sql.j2", L=layout, shard_count=shard_count, lock_class=LOCK_CLASS, runs_out=runs_out
    ) + render("generators/shared_catalog.sql.j2", L=layout, lock_class=LOCK_CLASS, lead_ms=LEAD_MS, runs_out=runs_out) + f"COMMENT ON FUNCTION pgidgen.min_id(pg_catalog.timestamptz) IS 'pgidgen catalog revision {CATALOG_REVISION}';\n"


def render_shard(layout: Layout, shard: int, *, grant_roles: Sequence[str] = (), generator: str = DEFAULT_GENERATOR) -> str:
    """Everything one shard needs: its schema, the generator's sequences and next_id(), its catalog row."""
    if generator not in GENERATORS:
        raise ConfigError(f"unknown generator {generator!r}", hint=f"use one of {', '.join(GENERATORS)}")
    return render(
        "shard.sql.j2",
        L=layout,
        shard=shard,
        schema=schema_name(shard),
        generator_template=GENERATORS[generator],
        grant_roles=list(grant_roles),
        lock_class=LOCK_CLASS,
        lead_ms=LEAD_MS,
        vmax=(layout.max_time << layout.sequence_bits) | (layout.ids_per_ms - 1),
        shard_bits_value=shard << layout.shard_shift,
        runs_out=iso_ms(layout.epoch_ms + (1 << layout.time_bits)),
    )


def render_shard_grants(shards: Sequence[int], roles: Sequence[str]) -> str:
    """--grant for shards that exist already (init renders new shards with their grants)."""
    return "".join(render("shard_grants.sql.j2", schema=schema_name(s), grant_roles=list(roles)) for s in shards)


def render_catalog_grants(roles: Sequence[str]) -> str:
    return render("catalog_grants.sql.j2", roles=list(roles))


#: next_id()'s fast path reads the generator state as parameter defaults and relies on the server evaluating them
#: in parameter order (docs/next_id.md, "The order of the reads"): checked on each database before a generator
#: is installed there. The probe has next_id's shapes (last value, nextval, last value of one sequence: in order,
#: b = a + 1 and c = b) and is called the ways next_id is: an aggregate's argument, a column DEFAULT of an
#: INSERT ... SELECT, a PL/pgSQL assignment, a generic prepared plan, and the INSERT once JIT-compiled where the
#: server has JIT (without LLVM's optimisation and inlining: 35 ms instead of 110-160 per database, and they
#: cannot change the order of calls that have side effects, which is all the probe looks at). Temporary objects,
#: created in a savepoint that is rolled back (or dropped, in the --sql script).
ORDER_PROBE = """
CREATE TEMPORARY SEQUENCE pgidgen_order_probe;
SELECT pg_catalog.nextval('pg_temp.pgidgen_order_probe');
CREATE FUNCTION pg_temp.pgidgen_order_probe(
    a pg_catalog.int8 DEFAULT pg_catalog.pg_sequence_last_value('pg_temp.pgidgen_order_probe'),
    b pg_catalog.int8 DEFAULT pg_catalog.nextval('pg_temp.pgidgen_order_probe'),
    c pg_catalog.int8 DEFAULT pg_catalog.pg_sequence_last_value('pg_temp.pgidgen_order_probe')) RETURNS pg_catalog.bool
LANGUAGE plpgsql AS 'BEGIN RETURN (a OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.=) b) AND (b OPERATOR(pg_catalog.=) c); END';
CREATE FUNCTION pg_temp.pgidgen_order_probe_loop() RETURNS pg_catalog.int8
LANGUAGE plpgsql AS 'DECLARE ok pg_catalog.bool; bad pg_catalog.int8 := 0; BEGIN
    FOR i IN 1..100 LOOP ok := pg_temp.pgidgen_order_probe(); IF ok IS NOT TRUE THEN bad := bad OPERATOR(pg_catalog.+) 1; END IF; END LOOP;
    RETURN bad; END';
CREATE TEMPORARY TABLE pgidgen_order_probe_t (ok pg_catalog.bool DEFAULT pg_temp.pgidgen_order_probe(), n pg_catalog.int4);
SET LOCAL plan_cache_mode = force_generic_plan;
PREPARE pgidgen_order_probe_p(pg_catalog.int4) AS
    INSERT INTO pg_temp.pgidgen_order_probe_t (n) SELECT g FROM pg_catalog.generate_series(1, $1) AS g;
EXECUTE pgidgen_order_probe_p(100);
DEALLOCATE pgidgen_order_probe_p;
SET LOCAL jit_above_cost = 0;
INSERT INTO pg_temp.pgidgen_order_probe_t (n) SELECT g FROM pg_catalog.generate_series(1, 100) AS g;
"""
ORDER_ERROR = "evaluates function arguments out of order, which next_id()'s fast path relies on"
ORDER_HINT = "report the PostgreSQL version to pgidgen; nothing was installed"
ORDER_CHECK = """
SELECT pg_catalog.count(*) FROM pg_temp.pgidgen_order_probe_t WHERE ok IS NOT TRUE
UNION ALL
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.-) pg_catalog.count(*) FILTER (WHERE ok)
FROM (SELECT pg_temp.pgidgen_order_probe() AS ok FROM pg_catalog.generate_series(1, 100) OFFSET 0) AS s
UNION ALL
SELECT pg_temp.pgidgen_order_probe_loop()
"""


def check_argument_order(conn: psycopg.Connection[Any], database: str) -> None:
    """Refuse a server that does not evaluate function defaults in parameter order (next_id() needs it). The probe
    needs TEMPORARY on the database, which hardened setups revoke from PUBLIC: said so, not 'lacks the rights'."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(ORDER_PROBE)
            bad = sum(int(r[0]) for r in conn.execute(ORDER_CHECK))
    except psycopg.errors.InsufficientPrivilege:
        row = conn.execute("SELECT pg_catalog.current_database()::text, current_user::text").fetchone()
        assert row is not None
        raise DatabaseError(
            f"database {database}: pgidgen checks how the server evaluates function arguments with temporary objects,"
            f" and role {row[1]} may not create them",
            hint=f"GRANT TEMPORARY ON DATABASE {ident(row[0])} TO {ident(row[1])}, or connect as the database's owner",
        ) from None
    if bad:
        raise DatabaseError(f"database {database} {ORDER_ERROR}", hint=ORDER_HINT)


def render_order_probe() -> str:
    """The same probe as a script that stops with an error where the order is wrong (init --sql runs no Python)."""
    return ORDER_PROBE + (
        "DO $probe$ BEGIN\n"
        f"    IF (SELECT pg_catalog.sum(n) FROM ({ORDER_CHECK.strip()}) AS c(n)) OPERATOR(pg_catalog.>) 0 THEN\n"
        f"        RAISE EXCEPTION {literal('pgidgen: this server ' + ORDER_ERROR)} USING HINT = {literal(ORDER_HINT)};\n"
        "    END IF;\n"
        "END $probe$;\n"
        "DROP TABLE pg_temp.pgidgen_order_probe_t;\n"
        "DROP FUNCTION pg_temp.pgidgen_order_probe_loop;\n"
        "DROP FUNCTION pg_temp.pgidgen_order_probe;\n"
        "DROP SEQUENCE pg_temp.pgidgen_order_probe;\n"
        "RESET plan_cache_mode;\nRESET jit_above_cost;\n"
    )
