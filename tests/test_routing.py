"""The application side (pgidgen/routing/) on real servers: routing, search_path, and moves flipping the map
under the router — simulated by hand here the way move-shard does it (retire + rename on the old database,
the shard created and activated on the new one), so the guarantee is tested independently of move-shard."""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from pgidgen.catalog import read_state
from pgidgen.cli import main as cli
from pgidgen.config import Config
from pgidgen.db import connect, execute_script
from pgidgen.errors import DatabaseUnavailableError, InputError, RoutingError, ShardMovedError, ShardUnavailableError
from pgidgen.idgen import CLAIM_LOCK_BASE, LOCK_CLASS, render_catalog, render_shard, schema_name
from pgidgen.init import init
from pgidgen.move.sqltext import freeze_sql
from pgidgen.routing import Router, hashed, modulo
from pgidgen.routing.breaker import CONNECT_TIMEOUT as ROUTER_CONNECT_TIMEOUT

SHARDS = 8
TABLE = "CREATE TABLE items (id bigint PRIMARY KEY DEFAULT next_id(), k bigint NOT NULL, note text);"


def create_in_shards(config: Config, ddl: str) -> None:
    """ddl (unqualified) in every shard of every database, with search_path = shard_N."""
    for dsn in config.databases.values():
        with psycopg.connect(dsn) as conn:
            st = read_state(conn)
            for s in sorted(st.active):
                conn.execute("SELECT set_config('search_path', %s, true)", (schema_name(s),))
                execute_script(conn, ddl)


@pytest.fixture
def sharded(config: Config) -> Config:
    """8 shards over db1 and db2 (0-3, 4-7), an items table in each; db3 is empty (a move target)."""
    outcomes = init(config, SHARDS, ["db1", "db2"])
    assert all(o.ok for o in outcomes), outcomes
    create_in_shards(config, TABLE)
    return config


@pytest.fixture
def router(sharded: Config) -> Any:
    r = Router(sharded, listen=False, retry_for=5.0)
    yield r
    r.close()


def insert(k: int, note: str = "") -> Callable[[psycopg.Connection[Any]], int]:
    def work(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("INSERT INTO items (k, note) VALUES (%s, %s) RETURNING id", (k, note)).fetchone()
        assert row is not None
        return int(row[0])

    return work


def count(dsn: str, schema: str, table: str = "items") -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))).fetchone()
        assert row is not None
        return int(row[0])


def hand_move(
    config: Config,
    shard: int,
    src: str,
    dst: str,
    *,
    ddl: str = TABLE,
    tables: tuple[str, ...] = ("items",),
    between: Callable[[], None] | None = None,
    after_lock: Callable[[], None] | None = None,
) -> str:
    """Move a shard the way move-shard's cutover does, by hand: the target gets the catalog, the shard, its tables,
    the rows and the generator state in one open transaction; the source takes the shard's claim lock and row
    (move-shard's own freeze_sql: draining routed transactions), copies, retires the row and renames the schema,
    commits; then the target commits. Returns the retired schema's name."""
    sch = schema_name(shard)
    retired = f"{sch}_retired_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(config.dsn(dst)) as d, psycopg.connect(config.dsn(src)) as s:
        count_row = s.execute("SELECT shard_count FROM pgidgen.layout").fetchone()
        assert count_row is not None
        if not read_state(d).has_catalog:
            execute_script(d, render_catalog(config.layout, shard_count=count_row[0]))
        execute_script(d, render_shard(config.layout, shard))
        d.execute("SELECT set_config('search_path', %s, true)", (sch,))
        execute_script(d, ddl)
        execute_script(s, freeze_sql(shard, [], 30_000))
        for t in tables:
            s.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.Identifier(sch, t)))
        if after_lock is not None:
            after_lock()
        for t in tables:
            rows = s.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(sch, t))).fetchall()
            if rows:
                marks = sql.SQL(", ").join(sql.Placeholder() * len(rows[0]))
                d.cursor().executemany(sql.SQL("INSERT INTO {} VALUES ({})").format(sql.Identifier(sch, t), marks), rows)
        last = s.execute("SELECT pgidgen.last_id(%s)", (shard,)).fetchone()
        assert last is not None
        d.execute("SELECT pgidgen.advance_generator(%s, %s)", (shard, last[0]))
        s.execute("UPDATE pgidgen.shards SET state = 'retired', schema_name = %s, updated_at = now() WHERE shard = %s", (retired, shard))
        s.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(sch), sql.Identifier(retired)))
        s.commit()
        if between is not None:
            between()
        d.commit()
    return retired


# -- routing --------------------------------------------------------------------------------------------


def test_shard_for_is_key_mod_shard_count_and_pluggable(router: Router, sharded: Config) -> None:
    assert router.shard_count == SHARDS
    assert [router.shard_for(k) for k in (0, 1, 7, 8, 13, 2**62)] == [0, 1, 7, 0, 5, (2**62) % SHARDS]
    with pytest.raises(InputError, match="shard key 'alice' is not an integer"):
        router.shard_for("alice")
    with Router(sharded, listen=False, shard_key=hashed) as r2:
        s = r2.shard_for("alice")
        assert 0 <= s < SHARDS and s == hashed("alice", SHARDS) == r2.shard_for("alice")
    with Router(sharded, listen=False, shard_key=lambda key, n: n) as bad:
        with pytest.raises(RoutingError, match=r"shard_key\(1\) returned 8, not a shard from 0 to 7"):
            bad.shard_for(1)
    assert modulo(-1, SHARDS) == 7


def test_database_for_follows_the_catalogs(router: Router) -> None:
    assert [router.database_for(s) for s in range(SHARDS)] == ["db1"] * 4 + ["db2"] * 4
    with pytest.raises(InputError, match="shard 8 does not exist"):
        router.database_for(8)


def test_shard_of_matches_next_id_and_sql(router: Router, sharded: Config) -> None:
    for shard in (0, 5, 7):
        new_id = router.run(shard, insert(shard))
        assert router.shard_of(new_id) == shard
        with psycopg.connect(sharded.dsn(router.database_for(shard))) as conn:
            assert conn.execute("SELECT pgidgen.shard_of(%s)", (new_id,)).fetchone() == (shard,)
    foreign = sharded.layout.encode(sharded.layout.epoch_ms + 1, 100, 0)
    with pytest.raises(InputError, match="names shard 100, but there are only 8"):
        router.shard_of(foreign)


def test_search_path_is_the_shards_for_the_transaction_only(router: Router, sharded: Config) -> None:
    with router.transaction(5) as conn:
        assert conn.execute("SHOW search_path").fetchone() == ('"shard_5", "public"',)
        conn.execute("INSERT INTO items (k) VALUES (5)")
    with router._connection("db2") as conn:  # the same pooled connection, back to its default
        assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
    assert count(sharded.dsn("db2"), "shard_5") == 1
    assert router.search_path_for(3) == '"shard_3", "public"'


def test_transaction_rolls_back_on_error(router: Router, sharded: Config) -> None:
    with pytest.raises(ZeroDivisionError):
        with router.transaction(1) as conn:
            conn.execute("INSERT INTO items (k) VALUES (1)")
            raise ZeroDivisionError  # the work fails after a write
    assert count(sharded.dsn("db1"), "shard_1") == 0


def test_a_missing_table_is_not_blamed_on_a_move(router: Router) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable):
        with router.transaction(2) as conn:
            conn.execute("SELECT * FROM no_such_table")
    assert router.stats["moved"] == 0


def test_claim_shard_refuses_a_shard_the_database_does_not_serve(sharded: Config) -> None:
    with psycopg.connect(sharded.dsn("db1")) as conn:
        assert conn.execute("SELECT pgidgen.claim_shard(1)").fetchone() == ("shard_1",)
        conn.rollback()
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SELECT pgidgen.claim_shard(6)")
        assert err.value.sqlstate == "PGR01"
        assert "shard 6 is not in this database" in str(err.value)
        conn.rollback()
        # NULLs (an unset bind parameter) fail instead of returning NULL unchecked and unlocked (found by a review)
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            conn.execute("SELECT pgidgen.claim_shard(NULL)")
        conn.rollback()
        assert conn.execute("SELECT pgidgen.claim_shard(1, NULL)").fetchone() == ("shard_1",)  # NULL: a write claim
        held = "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND classid = %s AND objid = %s"
        key = (LOCK_CLASS, CLAIM_LOCK_BASE - 1 + 2**32)  # pg_locks shows the int4 key as an unsigned oid
        assert conn.execute(held, key).fetchall() == [("ShareLock",)]
        conn.rollback()
        assert conn.execute("SELECT pgidgen.claim_shard(1, false)").fetchone() == ("shard_1",)
        assert conn.execute(held, key).fetchall() == []


@pytest.mark.sensitive
@pytest.mark.parametrize(("isolation", "form"), [
    *((level, form) for level in ("read committed", "repeatable read", "serializable", "repeatable read by default")
      for form in ("claim_shard", "CALL claim")),
    ("read committed, inside an INSERT", "claim_shard"),  # (a CALL is a statement of its own)
])
def test_a_write_claim_that_waited_for_a_flip_sees_it(sharded: Config, isolation: str, form: str) -> None:
    """The claim reads the shard's state after its lock. A claim that waited for a move's cutover must not go on
    with a state it read before the flip committed: under READ COMMITTED it reads the row again (PGR01), under
    REPEATABLE READ its snapshot is older than the flip and the row is read FOR SHARE (40001); so too when the
    isolation level is the database's default (a plain BEGIN, as the Router sends, starts it). A claim inside a
    larger statement, whose snapshot was taken before the wait, still reads the row with one of its own. The
    same for the CALL of pgidgen.claim, as the Router sends the claim."""
    outcome: dict[str, Any] = {}
    if isolation.endswith("by default"):
        with psycopg.connect(sharded.dsn("db1"), autocommit=True) as c:
            name = c.execute("SELECT current_database()").fetchone()[0]
            c.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'").format(sql.Identifier(name)))
    with psycopg.connect(sharded.dsn("db1")) as mover:
        execute_script(mover, freeze_sql(1, [], 30_000))  # the cutover's locks, as move-shard takes them

        def claim() -> None:
            with psycopg.connect(sharded.dsn("db1")) as conn:
                if not isolation.endswith("by default"):
                    level = isolation.split(",")[0].upper()
                    conn.execute(sql.SQL("SET TRANSACTION ISOLATION LEVEL {}").format(sql.SQL(level)))
                claim = "SELECT pgidgen.claim_shard(1)" if form == "claim_shard" else "CALL pgidgen.claim(1, 'shard_1')"
                if isolation.endswith("INSERT"):
                    claim = "INSERT INTO shard_1.items (k, note) SELECT 1, pgidgen.claim_shard(1) FROM shard_1.items RIGHT JOIN (VALUES (1)) v ON false RETURNING note"
                try:
                    cur = conn.execute(claim)
                    outcome["claimed"] = cur.fetchone() if cur.description else "called"
                except psycopg.Error as e:
                    outcome["sqlstate"] = e.sqlstate

        t = threading.Thread(target=claim)
        t.start()
        _wait_for_lock_wait(sharded.dsn("db1"))
        mover.execute("UPDATE pgidgen.shards SET state = 'retired' WHERE shard = 1")
        mover.commit()
        t.join(20)
    assert "claimed" not in outcome, outcome
    assert outcome.get("sqlstate") == ("PGR01" if isolation.startswith("read committed") else "40001"), outcome


def test_read_only_transactions_do_not_lock_the_row_and_cannot_write(router: Router, sharded: Config) -> None:
    router.run(2, insert(2))
    with psycopg.connect(sharded.dsn("db1")) as mover:  # a move's cutover holding the row
        mover.execute("SELECT 1 FROM pgidgen.shards WHERE shard = 2 FOR UPDATE")
        with router.transaction(2, read_only=True) as conn:
            assert conn.execute("SELECT count(*), pg_current_xact_id_if_assigned() FROM items").fetchone() == (1, None)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            with router.transaction(2, read_only=True) as conn:
                conn.execute("INSERT INTO items (k) VALUES (2)")
        mover.rollback()
    assert count(sharded.dsn("db1"), "shard_2") == 1


def test_a_stale_read_is_retried_on_the_new_database(router: Router, sharded: Config) -> None:
    router.run(5, insert(5, "x"))
    hand_move(sharded, 5, "db2", "db1")
    rows = router.run(5, lambda conn: conn.execute("SELECT note FROM items").fetchall(), read_only=True)
    assert rows == [("x",)] and router.stats["moved"] == 1 and router.database_for(5) == "db1"


# -- moves ----------------------------------------------------------------------------------------------


def test_a_stale_route_raises_shard_moved_and_writes_nothing_there(router: Router, sharded: Config) -> None:
    router.run(3, insert(3, "before"))
    assert router.database_for(3) == "db1"  # cached; listen=False, so the router learns of the move only by failing
    retired = hand_move(sharded, 3, "db1", "db3")
    with pytest.raises(ShardMovedError) as err:
        with router.transaction(3) as conn:
            conn.execute("INSERT INTO items (k) VALUES (3)")
    assert err.value.retryable and err.value.shard == 3 and err.value.database == "db1"
    assert "database db1 no longer serves shard 3; nothing was written there" in str(err.value)
    assert "password" not in str(err.value)
    new_id = router.run(3, insert(3, "after"))
    assert router.database_for(3) == "db3"
    assert count(sharded.dsn("db1"), retired) == 1  # only the row from before the move
    assert count(sharded.dsn("db3"), "shard_3") == 2
    with psycopg.connect(sharded.dsn("db3")) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM shard_3.items ORDER BY id")]
    assert ids[-1] == new_id and len(set(ids)) == 2


def test_run_retries_on_the_new_database(router: Router, sharded: Config) -> None:
    router.route(6)
    hand_move(sharded, 6, "db2", "db3")
    new_id = router.run(6, insert(6))  # the cached map still says db2
    assert router.stats["moved"] == 1 and router.stats["retries"] == 1
    assert router.database_for(6) == "db3" and router.shard_of(new_id) == 6
    assert count(sharded.dsn("db3"), "shard_6") == 1


def test_a_transaction_that_claimed_the_shard_holds_the_flip_back(router: Router, sharded: Config) -> None:
    """The core argument: the flip (an UPDATE of the row) waits for every routed transaction that claimed the
    shard, so their writes commit before it on the old database and the move carries them over."""
    in_tx = threading.Event()
    release = threading.Event()
    result: dict[str, Any] = {}

    def writer() -> None:
        with router.transaction(2) as conn:
            conn.execute("INSERT INTO items (k, note) VALUES (2, 'slow writer')")
            in_tx.set()
            release.wait(10)
        result["done"] = True

    t = threading.Thread(target=writer)
    t.start()
    assert in_tx.wait(10)
    mover = threading.Thread(target=lambda: result.setdefault("retired", hand_move(sharded, 2, "db1", "db3")))
    mover.start()
    _wait_for_lock_wait(sharded.dsn("db1"))  # the move is blocked on the writer's claim
    assert mover.is_alive()
    release.set()
    t.join(10)
    mover.join(10)
    assert result["done"] and not mover.is_alive()
    with psycopg.connect(sharded.dsn("db3")) as conn:
        assert conn.execute("SELECT note FROM shard_2.items").fetchall() == [("slow writer",)]


def test_a_write_arriving_during_the_cutover_blocks_then_goes_to_the_new_database(router: Router, sharded: Config) -> None:
    router.route(1)
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def late_writer() -> None:
        started.set()
        outcome["id"] = router.run(1, insert(1, "during cutover"))

    def during() -> None:
        t = threading.Thread(target=late_writer)
        outcome["thread"] = t
        t.start()
        started.wait(10)
        _wait_for_lock_wait(sharded.dsn("db1"))  # the writer's claim waits on the move

    retired = hand_move(sharded, 1, "db1", "db3", after_lock=during)
    outcome["thread"].join(15)
    assert router.shard_of(outcome["id"]) == 1
    assert count(sharded.dsn("db1"), retired) == 0
    with psycopg.connect(sharded.dsn("db3")) as conn:
        assert conn.execute("SELECT id, note FROM shard_1.items").fetchall() == [(outcome["id"], "during cutover")]


@pytest.mark.parametrize("api", ["run", "execute"])
def test_a_continuous_writer_across_a_move_loses_nothing(sharded: Config, api: str) -> None:
    """Router.run (a transaction) or Router.execute (one statement, its COMMIT in the same round trip)."""
    with Router(sharded, listen=True, retry_for=10.0) as router:
        stop = threading.Event()
        ids: list[int] = []
        errors: list[BaseException] = []

        def write() -> int:
            if api == "run":
                return router.run(4, insert(4))
            return int(router.execute(4, "INSERT INTO items (k, note) VALUES (%s, %s) RETURNING id", (4, ""))[0][0])

        def writer() -> None:
            try:
                while not stop.is_set():
                    ids.append(write())
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        _wait_until(lambda: len(ids) >= 20)
        retired = hand_move(sharded, 4, "db2", "db3", between=lambda: time.sleep(0.2))
        n = len(ids)
        _wait_until(lambda: len(ids) >= n + 20)
        stop.set()
        t.join(10)
        assert not errors, errors
        with psycopg.connect(sharded.dsn("db3")) as conn:
            stored = [r[0] for r in conn.execute("SELECT id FROM shard_4.items ORDER BY id")]
        assert stored == sorted(ids) and len(set(ids)) == len(ids)  # nothing lost, no duplicate
        assert ids == sorted(ids)  # still increasing after the move
        with psycopg.connect(sharded.dsn("db2")) as conn:
            old = {r[0] for r in conn.execute(sql.SQL("SELECT id FROM {}.items").format(sql.Identifier(retired)))}
        assert old <= set(stored) and len(stored) - len(old) >= 20  # the old copy: only rows from before the flip
        assert router.database_for(4) == "db3"


def test_listen_refreshes_the_map_without_a_failed_attempt(sharded: Config) -> None:
    with Router(sharded, listen=True) as router:
        assert router.database_for(7) == "db2"
        hand_move(sharded, 7, "db2", "db1")
        _wait_until(lambda: router.database_for(7) == "db1")
        router.run(7, insert(7))
        assert router.stats["moved"] == 0


def test_max_age_polls_map_versions_without_listening(sharded: Config) -> None:
    with Router(sharded, listen=False, max_age=0.05) as router:
        assert router.database_for(3) == "db1"
        loads = router.stats["map_loads"]
        time.sleep(0.1)
        assert router.database_for(3) == "db1" and router.stats["map_loads"] == loads  # versions unchanged: no re-read
        hand_move(sharded, 3, "db1", "db3")  # db3 gets its first catalog, db1's version moves
        time.sleep(0.1)
        assert router.database_for(3) == "db3" and router.stats["map_loads"] == loads + 1
        router.run(3, insert(3))
        assert router.stats["moved"] == 0


def test_a_shard_between_databases_is_unavailable_then_routed(router: Router, sharded: Config) -> None:
    seen: dict[str, Any] = {}

    def between() -> None:
        router.invalidate()
        with pytest.raises(ShardUnavailableError, match="no database serves shard 0 right now") as err:
            router.route(0)
        seen["retryable"] = err.value.retryable

    hand_move(sharded, 0, "db1", "db2", between=between)
    router.invalidate()
    assert seen["retryable"] and router.database_for(0) == "db2"


# -- errors ---------------------------------------------------------------------------------------------


def test_an_unreachable_database_is_named_and_the_others_still_route(sharded: Config, layout: Any) -> None:
    """Not a move (nothing to retry): the shards no reachable database serves are said to be on the one that is
    down, and their calls fail at once (tests/test_routing_outage.py stops a real server)."""
    dsns = dict(sharded.databases)
    dsns["db2"] = "postgresql://nobody:secret@127.0.0.1:1/x"
    broken = Config(layout=layout, databases=dsns)
    with Router(broken, listen=False, pool_timeout=1) as r:
        assert r.database_for(1) == "db1"
        with pytest.raises(DatabaseUnavailableError) as err:
            r.route(5)
        assert "database db2 is unreachable, and no other database serves shard 5" in str(err.value)
        assert err.value.database == "db2" and not err.value.retryable
        assert "secret" not in str(err.value)
        t0 = time.monotonic()
        with pytest.raises(DatabaseUnavailableError):
            r.run(5, insert(5))
        assert time.monotonic() - t0 < r.units.retry_for / 2  # not retried as a move would be


def test_no_catalog_anywhere(config: Config) -> None:
    with Router(config, listen=False) as r:
        with pytest.raises(RoutingError, match="no configured database has a pgidgen catalog: run 'pgidgen init --shards N' first"):
            r.shard_for(1)


def test_an_app_role_can_claim_but_not_change_the_map(config: Config) -> None:
    role = "app_" + uuid.uuid4().hex[:8]
    admin = config.dsn("db1")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        assert all(o.ok for o in init(config, SHARDS, ["db1"], grant_roles=[role]))
        create_in_shards(config, TABLE)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT ALL ON shard_1.items TO {}").format(sql.Identifier(role)))
        params = psycopg.conninfo.conninfo_to_dict(admin)
        params["user"] = role
        app = Config(layout=config.layout, databases={"db1": psycopg.conninfo.make_conninfo(**params)})
        with Router(app, listen=False) as r:
            new_id = r.run(1, insert(1))
            assert r.shard_of(new_id) == 1
        with psycopg.connect(app.dsn("db1")) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE pgidgen.shards SET state = 'retired' WHERE shard = 1")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_cli_locate(sharded: Config, config_file: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["--config", str(config_file), "locate", "--key", "13", "--shard", "2"])
    assert res.exit_code == 0, res.output
    assert res.output == "key 13: shard 5 on db2 (schema shard_5, active)\nshard 2: shard 2 on db1 (schema shard_2, active)\n"
    an_id = sharded.layout.encode(sharded.layout.epoch_ms + 5, 6, 1)
    res = runner.invoke(cli, ["--config", str(config_file), "locate", "--id", str(an_id), "--json"])
    assert res.exit_code == 0, res.output
    assert res.output == f'{{"id": {an_id}, "shard": 6, "database": "db2", "schema": "shard_6", "state": "active"}}\n'
    res = runner.invoke(cli, ["--config", str(config_file), "locate", "--shard", "99"])
    assert res.exit_code == 1
    assert res.output == "Error: shard 99 does not exist: shards are numbered 0 to 7\n"


# -- helpers --------------------------------------------------------------------------------------------


def _wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def _wait_for_lock_wait(dsn: str) -> None:
    """Until some session of dsn's database waits for a lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def waiting() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
            return row is not None and row[0] >= 1

        _wait_until(waiting)


def test_a_database_with_an_unset_variable_does_not_stop_the_router(sharded: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose db9 names an unset ${VAR} loads (commands that never connect to db9 need not know it); the
    router's listener for db9 treats it as down instead of dying with a traceback and holding start-up for the
    connect timeout (found by a review)."""
    from pgidgen.config import config_from_dict

    monkeypatch.delenv("PGIDGEN_NOPE_DSN", raising=False)
    cfg = config_from_dict({"databases": {**sharded.databases, "db9": "${PGIDGEN_NOPE_DSN}"}})
    cfg = Config(layout=sharded.layout, databases=cfg.databases, unset=cfg.unset)
    died: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    with Router(cfg) as r:
        assert r.run(2, insert(2)) > 0
    assert died == []


def test_a_connect_timeout_in_the_connection_string_is_the_routers(sharded: Config) -> None:
    """The DSN's own connect_timeout (a multi-host string's short one, for a quick failover) is what the Router's
    connections use, not pgidgen's default; without one, the Router's connect_timeout (2s unless given)."""
    own = {**sharded.databases, "db1": psycopg.conninfo.make_conninfo(sharded.dsn("db1"), connect_timeout=3)}
    app = Config(layout=sharded.layout, databases=own)
    with Router(app, listen=False) as r:
        used = {db: r.run(shard, lambda c: c.info.get_parameters().get("connect_timeout")) for db, shard in (("db1", 1), ("db2", 5))}
    assert used == {"db1": "3", "db2": str(ROUTER_CONNECT_TIMEOUT)}, used
    with Router(app, listen=False, connect_timeout=5) as r:  # the Router's own, overridden
        assert r.run(5, lambda c: c.info.get_parameters().get("connect_timeout")) == "5"
    with connect("db1", own["db1"]) as conn:  # pgidgen's own connections alike
        assert conn.info.get_parameters().get("connect_timeout") == "3"


def test_the_map_gives_each_shard_one_owner_and_names_conflicts() -> None:
    """build_routes over catalogs that disagree: an 'active' row wins over a 'moving' one, two of a kind are a
    conflict, 'incoming' marks a switch, and a database that is down keeps the shards last seen on it."""
    from pgidgen.catalog import CatalogState
    from pgidgen.layout import Layout
    from pgidgen.routing.mapcache import build_routes

    config = Config(layout=Layout.make(), databases={"db1": "dbname=a", "db2": "dbname=b", "db3": "dbname=c"})
    states = {
        "db1": CatalogState(shard_count=8, layout=config.layout, shards={0: "active", 1: "active", 2: "active", 3: "moving", 4: "active", 5: "moving", 6: "retired"}),
        "db2": CatalogState(shard_count=8, layout=config.layout, shards={1: "moving", 2: "active", 4: "incoming", 5: "moving", 6: "active"}),
    }
    m = build_routes(config, states, {"db1": 1, "db2": 1}, {})
    assert m.owners == {0: ("db1", "active"), 1: ("db1", "active"), 3: ("db1", "moving"), 4: ("db1", "active"), 6: ("db2", "active")}
    assert m.conflicts == {2: ["db1", "db2"], 5: ["db1", "db2"]}
    assert m.switching == {4}
    down = build_routes(config, {"db2": states["db2"]}, {"db2": 1}, {"db1": "connection refused"}, previous=m)
    assert down.owners == {0: ("db1", "active"), 1: ("db2", "moving"), 2: ("db2", "active"), 3: ("db1", "moving"), 4: ("db1", "active"),
                           5: ("db2", "moving"), 6: ("db2", "active")}
    assert down.conflicts == {}
