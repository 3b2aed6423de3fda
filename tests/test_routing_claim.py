"""The claim travels with the unit of work's first statement (pgidgen/routing/claiming.py): counted in the
protocol messages libpq sends, and checked on every other way a statement can start (COPY, a server-side cursor,
a nested transaction, another cursor class), which must claim first too."""
from __future__ import annotations

import tempfile
from typing import Any

import psycopg
import pytest
from test_routing import count, hand_move, insert, router, sharded  # noqa: F401 - fixtures

from pgidgen.config import Config
from pgidgen.errors import ShardMovedError
from pgidgen.idgen import CLAIM_LOCK_BASE, LOCK_CLASS
from pgidgen.routing import Router


def round_trips(conn: psycopg.Connection[Any], work: Any) -> list[str]:
    """The messages that each wait for the server (Query, Sync) that conn sends during work(), from libpq's trace."""
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            work()
        finally:
            conn.pgconn.untrace()
        f.seek(0)
        lines = [line.split("\t") for line in f.read().splitlines()]
    return [" ".join(p[2:]).strip() for p in lines if len(p) > 2 and p[0] == "F" and p[2].split()[0] in ("Query", "Sync")]


def test_a_single_statement_unit_is_two_round_trips(sharded: Config) -> None:
    """BEGIN + claim + the statement in one pipeline, then COMMIT: two, where plain psycopg takes three."""
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        with r._connection("db1") as conn:  # the pool's only connection
            pass
        trips = round_trips(conn, lambda: r.run(2, insert(2, "traced")))
        assert [t.split()[0] for t in trips] == ["Sync", "Query"], trips
        assert trips[1].endswith('"COMMIT"')
        reads = round_trips(conn, lambda: r.run(2, lambda c: c.execute("SELECT count(*) FROM items WHERE k = %s", (2,)).fetchone(), read_only=True))
        assert [t.split()[0] for t in reads] == ["Sync", "Query"], reads
        bare = round_trips(conn, lambda: r.run(2, lambda c: c.execute("SELECT count(*) FROM items").fetchone(), read_only=True))
        assert len(bare) == 2 and bare[0].startswith('Query  "BEGIN READ ONLY; CALL pgidgen.claim(2, '), bare
    with psycopg.connect(sharded.dsn("db1")) as plain:
        plain_trips = round_trips(plain, lambda: (plain.execute("INSERT INTO shard_2.items (k) VALUES (2)"), plain.commit()))
    assert len(plain_trips) == 3 and plain_trips[0].endswith('"BEGIN"'), plain_trips
    assert count(sharded.dsn("db1"), "shard_2") == 2


@pytest.mark.parametrize("way", ["copy", "server cursor", "nested transaction", "client cursor", "executemany", "pipeline"])
def test_every_way_a_statement_starts_claims_first(router: Router, sharded: Config, way: str) -> None:
    with router.transaction(6) as conn:
        if way == "copy":
            with conn.cursor().copy("COPY items (k, note) FROM STDIN") as cp:
                cp.write_row((6, way))
        elif way == "server cursor":
            with conn.cursor(name="c") as cur:
                cur.execute("SELECT count(*) FROM items")
                assert cur.fetchone() == (0,)
            conn.execute("INSERT INTO items (k, note) VALUES (6, %s)", (way,))
        elif way == "nested transaction":
            with conn.transaction():
                conn.execute("INSERT INTO items (k, note) VALUES (6, %s)", (way,))
        elif way == "client cursor":
            psycopg.ClientCursor(conn).execute("INSERT INTO items (k, note) VALUES (6, %s)", (way,))
        elif way == "pipeline":
            with conn.pipeline():
                conn.execute("INSERT INTO items (k, note) VALUES (6, %s)", (way,))
        else:
            conn.cursor().executemany("INSERT INTO items (k, note) VALUES (6, %s)", [(way,)])
        held = conn.execute(
            "SELECT count(*) FILTER (WHERE locktype = 'transactionid'),"
            " count(*) FILTER (WHERE locktype = 'advisory' AND mode = 'ShareLock' AND classid = %s AND objid = %s)"
            " FROM pg_locks WHERE pid = pg_backend_pid()", (LOCK_CLASS, CLAIM_LOCK_BASE - 6 + 2**32),
        ).fetchone()
        assert held == (1, 1)  # one transaction, the claim's lock held in it
        assert conn.execute("SHOW search_path").fetchone() == ('"shard_6", "public"',)
    with psycopg.connect(sharded.dsn("db2")) as c:
        assert c.execute("SELECT note FROM shard_6.items").fetchall() == [(way,)]


def test_no_commit_inside_a_unit_and_a_failed_claim_runs_nothing(router: Router, sharded: Config) -> None:
    with pytest.raises(psycopg.ProgrammingError, match="not allowed inside a Router unit of work"):
        with router.transaction(1) as conn:
            conn.execute("INSERT INTO items (k) VALUES (1)")
            conn.commit()
    assert count(sharded.dsn("db1"), "shard_1") == 0
    router.route(3)
    retired = hand_move(sharded, 3, "db1", "db3")
    with pytest.raises(ShardMovedError):
        with router.transaction(3) as conn:  # the stale route: the claim fails in the same pipeline as the INSERT
            conn.execute("INSERT INTO items (k) VALUES (3)")
    assert count(sharded.dsn("db1"), retired) == 0 and count(sharded.dsn("db3"), "shard_3") == 0
    with Router(sharded, listen=False) as r2:  # a stale route again, and the application's own pipeline
        r2.route(0)
        retired = hand_move(sharded, 0, "db1", "db3")
        with pytest.raises(ShardMovedError):
            with r2.transaction(0) as conn:
                with conn.pipeline() as p:
                    conn.execute("INSERT INTO items (k) VALUES (0)")
                    p.sync()
                    conn.execute("INSERT INTO items (k) VALUES (0)")
    assert count(sharded.dsn("db1"), retired) == 0 and count(sharded.dsn("db3"), "shard_0") == 0


def test_threads_share_one_connection_without_waiting_for_the_timeout(sharded: Config) -> None:
    """A unit gives its connection back to the router's idle list (reused warm); other threads, and map re-reads,
    take it from there or from the pool, never waiting out pool_timeout while it sits idle (a wait as long as
    pool_timeout would fail the unit with DatabaseError)."""
    import threading

    with Router(sharded, listen=False, min_size=1, max_size=1, pool_timeout=3) as r:
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for n in range(25):
                    r.run(5, insert(5, f"{k}-{n}"))
                    if n % 10 == 0:
                        r.invalidate()  # the map re-read needs the same connection
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [], errors
    assert count(sharded.dsn("db2"), "shard_5") == 100


def test_a_first_statement_without_parameters_may_hold_several(router: Router, sharded: Config) -> None:
    """As on a plain psycopg connection (the simple protocol): BEGIN, the claim and the statements in one message;
    the cursor shows the statements' results, not the claim's."""
    with router.transaction(6) as conn:
        cur = conn.execute("INSERT INTO items (k, note) VALUES (6, 'a'); SELECT note FROM items")
        assert cur.statusmessage == "INSERT 0 1" and cur.nextset() and cur.fetchall() == [("a",)]
        assert conn.execute("SHOW search_path").fetchone() == ('"shard_6", "public"',)
    router.route(7)
    hand_move(sharded, 7, "db2", "db1")
    with pytest.raises(ShardMovedError):
        with router.transaction(7) as conn:
            conn.execute("INSERT INTO items (k) VALUES (7)")
    assert count(sharded.dsn("db1"), "shard_7") == 0


@pytest.mark.parametrize("way", ["DEALLOCATE ALL first", "DEALLOCATE the claim by name", "DEALLOCATE the BEGIN by name"])
def test_a_unit_that_deallocates_does_not_break_the_next(sharded: Config, way: str) -> None:
    """The claim is prepared once per connection. A unit that drops prepared statements (DEALLOCATE ALL as its
    first statement, sent with the claim in one simple query; or the claim's statement, or the unit's prepared
    BEGIN, by name, which psycopg's cache never notices) must not make the next unit on that connection fail with
    26000: the cache forgets what the server dropped, or they are prepared again, in the same unit of work, before
    anything of it runs."""
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        with r._connection("db1") as conn:  # the pool's only connection
            pass
        r.run(2, insert(2, "claim prepared"))

        def drop(c: psycopg.Connection[Any]) -> None:
            if way == "DEALLOCATE ALL first":
                c.execute("DEALLOCATE ALL")
            else:
                pattern = "%pgidgen.claim%" if "claim" in way else "BEGIN"
                row = c.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE %s", (pattern,)).fetchone()
                assert row is not None
                c.execute(psycopg.sql.SQL("DEALLOCATE {}").format(psycopg.sql.Identifier(row[0])))

        for i in range(2):
            r.run(2, drop)
            trips = round_trips(conn, lambda: [r.run(2, insert(2, f"after {i}.{j}")) for j in range(2)])  # noqa: B023 - run within this iteration
            if way == "DEALLOCATE ALL first":  # the cache saw it: no failed attempt to roll back
                assert not [t for t in trips if "ROLLBACK" in t or "DEALLOCATE" in t], trips
    assert count(sharded.dsn("db1"), "shard_2") == 5


def test_a_router_on_a_repeatable_read_database_retries_a_write_the_flip_stopped(sharded: Config) -> None:
    """With default_transaction_isolation = 'repeatable read' set on the database, the Router's BEGIN starts a
    REPEATABLE READ transaction: a write that waited for the flip fails its claim with 40001, which the Router
    checks against the shard's row, reports as a move (nothing written) and runs again where the shard went."""
    import threading

    from psycopg import sql
    from test_routing import _wait_for_lock_wait

    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        name = c.execute("SELECT current_database()").fetchone()[0]
        c.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'").format(sql.Identifier(name)))
    outcome: dict[str, Any] = {}
    with Router(sharded, listen=False, retry_for=10.0) as r:
        r.run(1, lambda c: outcome.setdefault("isolation", c.execute("SHOW transaction_isolation").fetchone()[0]))

        def during() -> None:
            t = threading.Thread(target=lambda: outcome.setdefault("id", r.run(1, insert(1, "during cutover"))))
            outcome["thread"] = t
            t.start()
            _wait_for_lock_wait(sharded.dsn("db1"))

        retired = hand_move(sharded, 1, "db1", "db3", after_lock=during)
        outcome["thread"].join(15)
        assert outcome["isolation"] == "repeatable read" and r.stats["moved"] >= 1 and "id" in outcome, (outcome, r.stats)
    assert count(sharded.dsn("db1"), retired) == 0
    with psycopg.connect(sharded.dsn("db3")) as conn:
        assert conn.execute("SELECT id, note FROM shard_1.items").fetchall() == [(outcome["id"], "during cutover")]


def test_a_claim_refused_on_its_first_prepared_run_leaves_the_connection_usable(sharded: Config) -> None:
    """The claim is prepared with the first unit that has parameters; refused there (PGR01: a stale route), the
    statement after it does not run, the unit is a ShardMovedError, and the connection's statement cache and the
    server still agree: the next units on that connection (another shard of the same database) prepare and run."""
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        r.route(3)
        retired = hand_move(sharded, 3, "db1", "db3")
        with pytest.raises(ShardMovedError):
            with r.transaction(3) as conn:
                conn.execute("INSERT INTO items (k, note) VALUES (%s, %s)", (3, "stale"))
        for n in range(3):
            r.run(2, insert(2, f"after {n}"))
        with r._connection("db1") as conn:
            names = conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ("%pgidgen.claim%",)).fetchone()[0]
    assert names >= 1  # prepared again, and in use
    assert count(sharded.dsn("db1"), retired) == 0 and count(sharded.dsn("db3"), "shard_3") == 0
    assert count(sharded.dsn("db1"), "shard_2") == 3


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ"])
def test_a_claim_that_waited_for_a_cutover_that_gave_up_goes_on(sharded: Config, isolation: str) -> None:
    """The other side of the flip test in test_routing.py: a cutover that took the claim lock and the row, then
    rolled back (--max-pause ran out, the catch-up failed), changed nothing; the claims that waited for it pass,
    under REPEATABLE READ too (the row was locked, not updated: no 40001)."""
    import threading

    from psycopg import sql
    from test_routing import _wait_for_lock_wait

    from pgidgen.db import execute_script
    from pgidgen.move.sqltext import freeze_sql

    outcome: dict[str, Any] = {}
    with psycopg.connect(sharded.dsn("db1")) as mover:
        execute_script(mover, freeze_sql([0, 1], [], 30_000))

        def claim() -> None:
            with psycopg.connect(sharded.dsn("db1")) as conn:
                conn.execute(sql.SQL("SET TRANSACTION ISOLATION LEVEL {}").format(sql.SQL(isolation)))
                try:
                    outcome["claimed"] = conn.execute("SELECT pgidgen.claim_shard(1)").fetchone()
                    conn.execute("INSERT INTO shard_1.items (k, note) VALUES (1, 'after the cutover gave up')")
                except psycopg.Error as e:
                    outcome["sqlstate"] = e.sqlstate

        t = threading.Thread(target=claim)
        t.start()
        _wait_for_lock_wait(sharded.dsn("db1"))
        mover.rollback()
        t.join(20)
    assert outcome == {"claimed": ("shard_1",)}, outcome
    assert count(sharded.dsn("db1"), "shard_1") == 1


@pytest.mark.parametrize("first", ["with parameters (the claim prepared)", "without (one simple query)"])
@pytest.mark.parametrize("missing", ["claim_shard", "claim"])
def test_a_database_without_its_claim_is_named_and_the_connection_recovers(sharded: Config, first: str, missing: str) -> None:
    """The claim fails at its Parse (42883): the unit says which database lacks what and what to run, writes
    nothing, and once the catalog is back the same connection claims again. claim_shard: a catalog without it
    (nor the CALL's procedure: a connection claims by the SELECT of claim_shard then). claim: the procedure a
    connection found when it opened (has_claim_call) dropped later."""
    from pgidgen.errors import DatabaseError
    from pgidgen.render import static_sql

    def drop() -> None:
        with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
            c.execute("DROP PROCEDURE pgidgen.claim(integer, text, boolean)")
            if missing == "claim_shard":
                c.execute("DROP FUNCTION pgidgen.claim_shard(integer, boolean)")

    def write(c: psycopg.Connection[Any]) -> None:
        if first.startswith("with"):
            c.execute("INSERT INTO items (k, note) VALUES (%s, %s)", (2, "unclaimed"))
        else:
            c.execute("INSERT INTO items (k, note) VALUES (2, 'unclaimed')")

    if missing == "claim_shard":
        drop()
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        if missing == "claim":
            r.run(2, insert(2, "before"))
            r.run(2, lambda c: c.execute("INSERT INTO items (k, note) VALUES (2, 'before')"))
            drop()
        with pytest.raises(DatabaseError, match=f"database db1 has a pgidgen catalog without pgidgen.{missing}\\(\\)"):
            r.run(2, write)
        before = 2 if missing == "claim" else 0
        assert count(sharded.dsn("db1"), "shard_2") == before
        with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
            c.execute(static_sql("catalog.sql"))
        for n in range(3):
            r.run(2, insert(2, f"claimed {n}"))
    assert count(sharded.dsn("db1"), "shard_2") == before + 3


@pytest.mark.parametrize("way", ["COMMIT; INSERT first", "COMMIT; INSERT later", "END, commented", "COMMIT AND CHAIN", "ROLLBACK",
                                 "PREPARE TRANSACTION", "executemany COMMIT", "libpq's COMMIT, then INSERT"])
def test_a_unit_cannot_end_its_transaction_and_go_on_unclaimed(router: Router, sharded: Config, way: str) -> None:
    """The connection is autocommit: had a statement of the unit ended its transaction, the statements after it
    would run each on its own, unclaimed (no lock against a flip, perhaps on a database that no longer serves
    the shard). Statements that end it are refused before they are sent (routing/ending.py), and one that got
    through another way (libpq's own exec, which nothing of psycopg sees) leaves the next statement refused; the unit rolls back, nothing of it stays,
    and the connection's next unit claims as ever."""
    unclaimed = "INSERT INTO items (k, note) VALUES (1, 'unclaimed')"

    def work(c: psycopg.Connection[Any]) -> None:
        if way == "COMMIT; INSERT first":
            c.execute("COMMIT; " + unclaimed)
            return
        c.execute("INSERT INTO items (k, note) VALUES (%s, %s)", (1, "claimed"))
        if way == "COMMIT; INSERT later":
            c.execute("COMMIT; " + unclaimed)
        elif way == "END, commented":
            c.execute("/* done */ END")
        elif way == "COMMIT AND CHAIN":
            c.execute("commit and chain")
        elif way == "ROLLBACK":
            c.execute("ROLLBACK")
        elif way == "PREPARE TRANSACTION":
            c.execute("PREPARE TRANSACTION 'pgidgen_test'")
        elif way == "executemany COMMIT":
            c.cursor().executemany("COMMIT", [()])
        else:
            c.pgconn.exec_(b"COMMIT")
        c.execute("INSERT INTO items (k, note) VALUES (%s, %s)", (1, "unclaimed"))

    with pytest.raises(psycopg.ProgrammingError, match="Router unit|unit of work's transaction"):
        router.run(1, work)
    claimed = 1 if way.startswith("libpq") else 0  # libpq's COMMIT went through: the row before it
    with psycopg.connect(sharded.dsn("db1")) as c:
        assert c.execute("SELECT note, count(*) FROM shard_1.items GROUP BY 1").fetchall() == ([("claimed", 1)] if claimed else [])
        assert c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
    router.run(1, lambda c: c.execute("SAVEPOINT a; SELECT CASE WHEN true THEN 1 END; ROLLBACK TO SAVEPOINT a"))  # not refused
    assert router.run(1, insert(1, "after")) > 0
    assert count(sharded.dsn("db1"), "shard_1") == claimed + 1


@pytest.mark.parametrize("api", ["run", "async run"])
def test_a_commit_whose_connection_broke_is_not_run_again(sharded: Config, api: str) -> None:
    """A COMMIT that left but whose connection broke (here its server process is terminated while a deferred
    trigger holds the COMMIT, and meanwhile the shard's row says it moved) may or may not have been applied: the
    Router raises the error as psycopg does and runs nothing again, even though the row would make it look like a
    move (57P01 is one of a move's symptoms, and retrying after it could write twice)."""
    import asyncio
    import threading
    import time

    from pgidgen.routing import AsyncRouter

    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE FUNCTION shard_2.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$")
        c.execute("CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON shard_2.items DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shard_2.slow()")
    failed: list[BaseException] = []
    stats: dict[str, int] = {}

    def write() -> None:
        try:
            if api == "run":
                with Router(sharded, listen=False, retry_for=2.0) as r:
                    try:
                        r.run(2, insert(2, "cut"))
                    finally:
                        stats.update(r.stats)
            else:
                async def main() -> None:
                    async with AsyncRouter(sharded, listen=False, retry_for=2.0) as r:
                        try:
                            await r.run(2, lambda c: c.execute("INSERT INTO items (k, note) VALUES (2, 'cut')"))
                        finally:
                            stats.update(r.stats)
                asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - checked below
            failed.append(e)

    t = threading.Thread(target=write)
    t.start()
    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        pid = None
        for _ in range(500):
            row = c.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query = 'COMMIT'").fetchone()
            if row:
                pid = row[0]
                break
            time.sleep(0.02)
        assert pid is not None, "the COMMIT never reached the trigger"
        # as if it moved meanwhile: with triggers off, else claim_fence would wait for the COMMIT's claim lock
        c.execute("SET session_replication_role = replica")
        c.execute("UPDATE pgidgen.shards SET state = 'retired' WHERE shard = 2")
        c.execute("SELECT pg_terminate_backend(%s)", (pid,))
    t.join(30)
    assert not t.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], psycopg.OperationalError), failed
    assert stats["retries"] == 0 and stats["moved"] == 0, stats


@pytest.mark.parametrize("shard", [6, 3], ids=["not in this database", "retired here"])
def test_the_call_claim_cannot_be_led_astray_by_the_callers_search_path(sharded: Config, shard: int) -> None:
    """pgidgen.claim runs with the caller's search_path (setting it is its job: no SET clause), so every operator in
    it is qualified: a schema ahead of pg_catalog on that path, with an `=` that matches every row and a `<>` that
    never differs, changes nothing. It still refuses a shard the database does not serve (PGR01), and for one it
    serves it sets search_path for the transaction only."""
    if shard == 3:
        hand_move(sharded, 3, "db1", "db3")
    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE SCHEMA evil")
        c.execute("CREATE FUNCTION evil.yes(integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
        c.execute("CREATE FUNCTION evil.same(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false'")
        c.execute("CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.yes)")
        c.execute("CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.same)")
    with psycopg.connect(sharded.dsn("db1")) as conn:
        conn.execute("SET search_path = evil, pg_catalog")
        conn.commit()
        assert conn.execute("SELECT 1 = 2, 'a' <> 'b'").fetchone() == (True, False)  # the path does lead astray
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("CALL pgidgen.claim(%s, 'shard_1')", (shard,))
        assert refused.value.sqlstate == "PGR01", refused.value
        conn.rollback()
        conn.execute("CALL pgidgen.claim(1, '\"shard_1\", public')")
        assert conn.execute("SHOW search_path").fetchone() == ('"shard_1", public',)
        conn.commit()
        assert conn.execute("SHOW search_path").fetchone() == ("evil, pg_catalog",)


def test_a_catalog_without_the_call_is_claimed_by_select_until_it_has_it(sharded: Config) -> None:
    """A database whose catalog predates pgidgen.claim (revision 4) is claimed by the SELECT of claim_shard, with
    no error; once its catalog is brought up, connections opened from then on claim by CALL."""
    from pgidgen.render import static_sql

    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute("DROP PROCEDURE pgidgen.claim(integer, text, boolean)")
    for round in ("old catalog", "upgraded"):
        with Router(sharded, listen=False, min_size=1, max_size=1) as r:
            with r._connection("db1") as conn:
                pass
            trips = round_trips(conn, lambda: [r.run(2, insert(2, round)), r.run(2, lambda c: c.execute("SELECT 1"))])  # noqa: B023 - run within this iteration
            parses = round_trips(conn, lambda: None)
            assert len(trips) == 4 and parses == [], trips
        sent = " ".join(trips)
        assert ("CALL pgidgen.claim(" in sent) == (round == "upgraded"), sent
        assert ("pgidgen.claim_shard(" in sent) == (round == "old catalog"), sent
        with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
            c.execute(static_sql("catalog.sql"))
    assert count(sharded.dsn("db1"), "shard_2") == 2


def test_a_role_that_may_not_take_advisory_locks_is_claimed_by_select(sharded: Config) -> None:
    """pgidgen.claim runs with the caller's rights, so it calls pg_advisory_xact_lock_shared and current_setting
    as the application's role; claim_shard (SECURITY DEFINER) calls them as the catalog's owner. A hardened
    database that revokes the advisory lock functions from PUBLIC made every write unit fail with 42501 (found by
    a review): such a role claims by the SELECT of claim_shard, as before the CALL, and writes and reads."""
    from dataclasses import replace

    from psycopg.conninfo import make_conninfo

    from pgidgen.db import execute_script
    from pgidgen.idgen import render_catalog_grants, render_shard_grants

    role = "pgidgen_no_advisory"
    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {role}")
        c.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with psycopg.connect(sharded.dsn("db1")) as c:  # init --grant's grants
            execute_script(c, render_catalog_grants([role]) + render_shard_grants([2], [role]))
            c.execute(f"GRANT SELECT, INSERT ON shard_2.items TO {role}")
            c.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_xact_lock_shared(integer, integer) FROM PUBLIC")
        app = replace(sharded, app_dsns={"db1": make_conninfo(sharded.dsn("db1"), user=role)})
        with Router(app, listen=False, min_size=1, max_size=1) as r:
            r.run(2, lambda c: c.execute("INSERT INTO items (k, note) VALUES (%s, %s)", (2, "claimed")))
            r.run(2, lambda c: c.execute("INSERT INTO items (k, note) VALUES (2, 'claimed, simple')"))
            assert r.run(2, lambda c: c.execute("SELECT count(*) FROM items").fetchone()[0], read_only=True) == 2
            assert r.run(2, lambda c: c.execute("SELECT current_user").fetchone()[0], read_only=True) == role
    finally:
        with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE IF EXISTS {role}")
    assert count(sharded.dsn("db1"), "shard_2") == 2
