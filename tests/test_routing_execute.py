"""Router.execute / AsyncRouter.execute on real servers: one statement as a unit of work of its own, its claim,
the statement and the commit in one round trip (the extended protocol's implicit transaction, committed at its
Sync). The guarantee is Router.run's: nothing runs before the claim, a refused claim runs nothing, a move is
retried on the new database; and the commit that travels with the statement is checked like one sent alone."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from test_routing import count, hand_move, router, sharded  # noqa: F401 - fixtures
from test_routing_claim import round_trips

from pgidgen.config import Config
from pgidgen.idgen import CLAIM_LOCK_BASE, LOCK_CLASS
from pgidgen.routing import AsyncRouter, Router

INSERT = "INSERT INTO items (k, note) VALUES (%s, %s) RETURNING id"
#: the extended protocol's implicit transaction and a pipeline's errors are the server's: every major
pytestmark = pytest.mark.sensitive


def locks_held(dsn: str, shard: int) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s",
                        (LOCK_CLASS, (CLAIM_LOCK_BASE - shard) & 0xFFFFFFFF)).fetchone()
        assert row is not None
        return int(row[0])


def test_one_round_trip_rows_back_and_nothing_left_open(sharded: Config) -> None:
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        with r._connection("db1") as conn:  # the pool's only connection
            pass
        for _ in range(7):  # past psycopg's prepare threshold: the claim and the statement go prepared
            trips = round_trips(conn, lambda: r.execute(2, INSERT, (2, "one trip")))
            assert [t.split()[0] for t in trips] == ["Sync"], trips
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        rows = r.execute(2, "SELECT count(*), min(note) FROM items WHERE k = %s", (2,), read_only=True)
        assert rows == [(7, "one trip")]
        # no parameters: the same pipeline (one statement by the extended protocol), not a simple query
        bare = round_trips(conn, lambda: r.execute(2, "SELECT count(*) FROM items", read_only=True))
        assert bare == ["Sync"], bare
        assert r.execute(2, "UPDATE items SET note = 'x' WHERE k = 2") == []  # no rows: []
        assert r.execute(2, "SELECT current_setting('search_path')", read_only=True) == [('"shard_2", "public"',)]
        assert conn.execute("SELECT current_setting('search_path')").fetchone() != ('"shard_2", "public"',)  # for that one only
    assert locks_held(sharded.dsn("db1"), 2) == 0
    assert count(sharded.dsn("db1"), "shard_2") == 7


@pytest.mark.parametrize("params", [True, False], ids=["with parameters", "without"])
def test_a_commit_that_fails_is_raised_and_writes_nothing(router: Router, sharded: Config, params: bool) -> None:
    """The commit travels with the statement: a deferred constraint that fails there is the caller's error, as
    conn.commit() would raise it, and nothing of the statement stays."""
    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.d (k int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(psycopg.errors.UniqueViolation):
        if params:
            router.execute(1, "INSERT INTO d VALUES (%s), (%s)", (1, 1))
        else:
            router.execute(1, "INSERT INTO d VALUES (1), (1)")
    with router._connection("db1") as conn:  # the one the failed unit gave back: out of the pipeline, no transaction
        assert (conn.pgconn.transaction_status, conn.pgconn.pipeline_status) == CLEAN[:2]
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # read_only: the claim makes it so, and it is not a move
        router.execute(1, "INSERT INTO d VALUES (%s)", (2,), read_only=True)
    assert router.execute(1, "INSERT INTO d VALUES (%s) RETURNING k", (3,)) == [(3,)]  # the connection goes on
    assert count(sharded.dsn("db1"), "shard_1", "d") == 1
    assert router.stats["moved"] == 0 and router.stats["retries"] == 0


def in_unit(r: Router) -> tuple[Any, Any, Any]:
    """The next unit's view of its pooled connection: its state on leaving the last one, and its claim's lock."""
    with r._connection("db1") as conn:
        states = (conn.pgconn.transaction_status, conn.pgconn.pipeline_status)
    return (*states, r.execute(1, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")[0][0])


CLEAN = (psycopg.pq.TransactionStatus.IDLE, psycopg.pq.PipelineStatus.OFF, 1)


@pytest.mark.parametrize("read_only", [False, True], ids=["write", "read_only"])
def test_a_string_of_statements_is_refused_and_nothing_of_it_runs(sharded: Config, read_only: bool) -> None:
    """One statement: sent as one simple query with the claim, "COMMIT; INSERT ..." would commit the claim's
    transaction and run the INSERT unclaimed (no lock against the flip, and writable under read_only). The
    extended protocol takes one statement: the server refuses the string and nothing of it runs."""
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        for query in ("COMMIT; INSERT INTO items (k, note) VALUES (1, 'unclaimed')",
                      "COMMIT; INSERT INTO shard_1.items (k, note) VALUES (1, 'unclaimed')",
                      "BEGIN; INSERT INTO shard_1.items (k, note) VALUES (1, 'two')"):
            # a COMMIT among them: refused before anything is sent (routing/ending.py); else the server's refusal
            refusal = (psycopg.ProgrammingError, "not allowed inside a Router unit") if "COMMIT" in query else (psycopg.errors.SyntaxError, "multiple commands")
            with pytest.raises(refusal[0], match=refusal[1]):
                r.execute(1, query, read_only=read_only)
            assert in_unit(r) == CLEAN
        assert r.stats["moved"] == 0 and r.stats["retries"] == 0
    assert count(sharded.dsn("db1"), "shard_1") == 0


@pytest.mark.parametrize(("statement", "error"), [
    ("CALL shard_1.commits(%s)", psycopg.errors.InvalidTransactionTermination),
    ("CALL shard_1.commits(1)", psycopg.errors.InvalidTransactionTermination),
    ("VACUUM shard_1.items", psycopg.errors.ActiveSqlTransaction),
    ("CREATE INDEX CONCURRENTLY ON shard_1.items (k)", psycopg.errors.ActiveSqlTransaction),
    ("COMMIT", psycopg.ProgrammingError), ("BEGIN", None), ("ROLLBACK", psycopg.ProgrammingError),
])
def test_what_would_end_the_claims_transaction_runs_nothing_unclaimed(sharded: Config, statement: str, error: Any) -> None:
    """The claim's transaction is a block, as in Router.run: a procedure's COMMIT (let through by PostgreSQL
    before 18 in the extended protocol's implicit transaction, the rest of the procedure then unclaimed), VACUUM,
    CREATE INDEX CONCURRENTLY are the server's errors; COMMIT and ROLLBACK are refused before they are sent
    (routing/ending.py), a BEGIN only warns; and the connection goes back clean, the next unit claims."""
    with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
        c.execute("""CREATE PROCEDURE shard_1.commits(n int) LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO shard_1.items (k, note) VALUES (n, 'claimed');
                COMMIT;
                INSERT INTO shard_1.items (k, note) VALUES (n, 'unclaimed');
            END $$""")
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        params = (1,) if "%s" in statement else None
        if error is None:
            assert r.execute(1, statement, params) == []
        else:
            with pytest.raises(error):
                r.execute(1, statement, params)
        assert in_unit(r) == CLEAN
    assert count(sharded.dsn("db1"), "shard_1") == 0
    with psycopg.connect(sharded.dsn("db1")) as c:
        assert c.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = 'shard_1' AND indexdef LIKE '%(k)%'").fetchone() == (0,)


def test_a_stale_route_is_retried_and_writes_nothing_on_the_old_database(router: Router, sharded: Config) -> None:
    router.execute(3, INSERT, (3, "before"))
    retired = hand_move(sharded, 3, "db1", "db3")
    [(new_id,)] = router.execute(3, INSERT, (3, "after"))  # the cached map still says db1
    assert router.stats["moved"] == 1 and router.stats["retries"] == 1 and router.database_for(3) == "db3"
    assert router.shard_of(new_id) == 3
    assert count(sharded.dsn("db1"), retired) == 1  # only the row from before the move
    assert count(sharded.dsn("db3"), "shard_3") == 2


def test_a_claim_dropped_by_name_is_prepared_again(sharded: Config) -> None:
    """The claim is prepared once per connection; a unit that DEALLOCATEs it by name (psycopg's cache never
    notices) must not fail the next execute: the implicit transaction is gone with the failed claim, the cache
    forgets, and the same execute prepares it again."""
    with Router(sharded, listen=False, min_size=1, max_size=1) as r:
        for i in range(7):
            r.execute(2, INSERT, (2, f"warm {i}"))

        def drop(c: psycopg.Connection[Any]) -> None:
            row = c.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE '%pgidgen.claim%'").fetchone()
            assert row is not None
            c.execute(psycopg.sql.SQL("DEALLOCATE {}").format(psycopg.sql.Identifier(row[0])))

        r.run(2, drop)
        r.execute(2, INSERT, (2, "after"))
        assert r.stats["moved"] == 0
    assert count(sharded.dsn("db1"), "shard_2") == 8


def test_a_write_whose_connection_broke_after_it_was_sent_is_not_run_again(router: Router, sharded: Config) -> None:
    """The server may have committed a statement sent with its commit before the connection broke: execute raises
    (as psycopg does) rather than run the write a second time. Here the write waits on a lock, its server process
    is terminated, and the row is not there once, nor twice."""
    router.execute(0, INSERT, (0, "warm"))
    failed: list[BaseException] = []
    with psycopg.connect(sharded.dsn("db1")) as holder, psycopg.connect(sharded.dsn("db1"), autocommit=True) as watcher:
        holder.execute("LOCK TABLE shard_0.items IN ACCESS EXCLUSIVE MODE")

        def write() -> None:
            try:
                router.execute(0, INSERT, (0, "cut"))
            except BaseException as e:  # noqa: BLE001 - checked below
                failed.append(e)

        t = threading.Thread(target=write)
        t.start()
        for _ in range(200):
            row = watcher.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE 'INSERT INTO items%' AND wait_event_type = 'Lock'").fetchone()
            if row:
                break
            time.sleep(0.02)
        assert row, "the write never waited on the lock"
        holder.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        holder.commit()
        t.join(10)
    assert len(failed) == 1 and isinstance(failed[0], psycopg.OperationalError), failed
    assert router.stats["retries"] == 0
    with psycopg.connect(sharded.dsn("db1")) as c:
        assert c.execute("SELECT count(*) FROM shard_0.items WHERE note = 'cut'").fetchone() == (0,)
    assert router.execute(0, INSERT, (0, "again"))  # the pool replaced the broken connection


def terminate(dsn: str, pid: int) -> None:
    """End a server process and wait until it is gone (its last words on its client's socket)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_connection_whose_server_ended_in_the_pool_is_replaced_and_the_write_goes_once(sharded: Config, api: str) -> None:
    """A pooled connection whose server process ended while it sat idle (a restart, an idle timeout) is found
    broken before the write leaves: nothing can have been committed, so execute tries again on a new connection,
    as Router.run does, rather than raise the error of a write that was never sent."""
    write = "INSERT INTO items (k, note) VALUES (%s, 'once') RETURNING id"
    if api == "sync":
        with Router(sharded, listen=False, min_size=1, max_size=1) as r:
            [(pid,)] = r.execute(1, "SELECT pg_backend_pid()")
            terminate(sharded.dsn("db1"), pid)
            [(new_id,)] = r.execute(1, write, (1,))
            stats = dict(r.stats)
    else:
        async def main() -> tuple[int, dict[str, int]]:
            async with AsyncRouter(sharded, listen=False, min_size=1, max_size=1) as r:
                [(pid,)] = await r.execute(1, "SELECT pg_backend_pid()")
                terminate(sharded.dsn("db1"), pid)
                [(new_id,)] = await r.execute(1, write, (1,))
                return new_id, dict(r.stats)

        new_id, stats = asyncio.run(main())
    assert stats["retries"] == 1 and stats["moved"] == 0
    with psycopg.connect(sharded.dsn("db1")) as c:
        assert c.execute("SELECT id FROM shard_1.items WHERE note = 'once'").fetchall() == [(new_id,)]


def test_async_execute(sharded: Config) -> None:
    async def main() -> tuple[list[Any], list[Any], dict[str, int]]:
        async with AsyncRouter(sharded, listen=False) as r:
            first = await r.execute(6, INSERT, (6, "async"))
            hand_move(sharded, 6, "db2", "db3")
            second = await r.execute(6, INSERT, (6, "moved"))  # retried on db3
            rows = await r.execute(6, "SELECT note FROM items ORDER BY id", read_only=True)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                await r.execute(6, "DELETE FROM items", read_only=True)
            with pytest.raises(psycopg.ProgrammingError, match="not allowed inside a Router unit"):  # as Router's
                await r.execute(6, "COMMIT; DELETE FROM items", read_only=True)
            with pytest.raises(psycopg.errors.SyntaxError, match="multiple commands"):  # one statement, as Router's
                await r.execute(6, "SELECT 1; DELETE FROM items", read_only=True)
            return first + second, rows, dict(r.stats)

    ids, rows, stats = asyncio.run(main())
    assert rows == [("async",), ("moved",)] and stats["moved"] == 1
    assert len({i for (i,) in ids}) == 2
    assert count(sharded.dsn("db3"), "shard_6") == 2
