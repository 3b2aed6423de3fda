"""Router.fan_out on real servers (issue 34): one statement on every shard, merged; the order and limit merge on
skewed shards equal to a reference read shard by shard; counts, sums, min and max combined; every shard read
exactly once while a batch of shards moves (a real move_shards) and while a hand-made flip has the map behind;
what a stopped database leaves out with partial=True; through PgBouncer in transaction mode; the AsyncRouter's."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_routing import SHARDS, TABLE, create_in_shards, hand_move
from test_routing_outage import db2_server  # noqa: F401 (a fixture)
from test_routing_pooler import app_config, bouncer_root  # noqa: F401 (a fixture)

from pgidgen import pgbouncer, sandbox
from pgidgen.config import Config
from pgidgen.errors import DatabaseUnavailableError, InputError, QueryError
from pgidgen.idgen import schema_name
from pgidgen.init import init
from pgidgen.move import move_shards
from pgidgen.routing import AsyncRouter, Router, fanout

#: rows per shard: skewed, two shards empty (db1 holds 0-3, db2 4-7)
ROWS = {0: 0, 1: 1, 2: 40, 3: 3, 4: 0, 5: 60, 6: 7, 7: 2}
Row = tuple[int, int, int, "str | None"]  # shard, id, k, note


def fill(config: Config) -> list[Row]:
    """ROWS rows in each shard, written round-robin (so the newest IDs are spread over the shards), k with ties and
    every fifth note NULL; every row as (shard, id, k, note)."""
    conns = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in config.databases.items()}
    out: list[Row] = []
    try:
        n = 0
        for turn in range(max(ROWS.values())):
            for shard, count in ROWS.items():
                if turn >= count:
                    continue
                n += 1
                conn = conns["db1" if shard < 4 else "db2"]
                note = None if n % 5 == 0 else f"note {n % 7}"
                query = sql.SQL("INSERT INTO {} (k, note) VALUES (%s, %s) RETURNING id").format(sql.Identifier(schema_name(shard), "items"))
                row = conn.execute(query, (n % 4, note)).fetchone()
                assert row is not None
                out.append((shard, int(row[0]), n % 4, note))
    finally:
        for c in conns.values():
            c.close()
    return out


@pytest.fixture
def spread(config: Config) -> Config:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    create_in_shards(config, TABLE)
    return config


@pytest.fixture
def rows(spread: Config) -> list[Row]:
    return fill(spread)


@pytest.fixture
def router(spread: Config) -> Iterator[Router]:
    with Router(spread, listen=False, retry_for=10.0) as r:
        yield r


def reference(rows: list[Row], keys: list[tuple[int, bool]], limit: int | None, shards: range | list[int] = range(SHARDS)) -> list[Row]:
    """What one query over every shard would return: sorted by (position in a Row, descending) keys, NULLs last
    ascending and first descending, as PostgreSQL sorts."""
    chosen = [r for r in rows if r[0] in shards]
    for pos, desc in reversed(keys):  # stable sorts, least significant key first
        chosen.sort(key=lambda r, p=pos: (r[p] is None, r[p]), reverse=desc)
    return chosen[:limit] if limit is not None else chosen


@pytest.mark.parametrize("chunk", [100, 3])  # 3: several chunks (statements) a database, merged
def test_order_and_limit_merge_on_skewed_shards(router: Router, rows: list[Row], chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "CHUNK", chunk)
    q = "SELECT id, k, note FROM items"
    cases: list[tuple[Any, list[tuple[int, bool]], int | None]] = [
        ("-id", [(1, True)], 10),  # the newest rows across every shard
        ("id", [(1, False)], 7),
        (["k", "-id"], [(2, False), (1, True)], 25),
        (["-note", "id DESC"], [(3, True), (1, True)], 30),  # NULLs first descending
        ("note, id", [(3, False), (1, False)], None),  # NULLs last ascending; everything
        ("-id", [(1, True)], 1000),  # more than there is
    ]
    for order_by, keys, limit in cases:
        got = list(router.fan_out(q, order_by=order_by, limit=limit, with_shard=True))
        assert got == reference(rows, keys, limit), (order_by, limit)
    assert list(router.fan_out(q, order_by="-id", limit=5, shards=[5, 6, 7], with_shard=True)) == reference(rows, [(1, True)], 5, [5, 6, 7])
    assert list(router.fan_out(q, order_by="-id", limit=0)) == []
    unordered = list(router.fan_out(q, with_shard=True))
    assert sorted(unordered) == sorted(rows) and len(unordered) == len(rows)
    limited = list(router.fan_out(q, limit=4))
    assert len(limited) == 4 and set(limited) <= {r[1:] for r in rows}
    res = router.fan_out("SELECT id, k FROM items WHERE k = %s", (2,), order_by="-id", limit=3)
    assert res.columns == ["id", "k"] and res.shards == list(range(SHARDS)) and res.complete
    assert list(res) == list(res) == [r[1:3] for r in reference([r for r in rows if r[2] == 2], [(1, True)], 3)]  # iterated twice


def test_counts_sums_min_max_combined(router: Router, rows: list[Row]) -> None:
    total = router.fan_out("SELECT count(*) FROM items", combine="sum")
    assert total.scalar() == len(rows) == sum(ROWS.values())
    assert list(router.fan_out("SELECT count(*), sum(k), min(id), max(id) FROM items", combine=("sum", "sum", "min", "max"))) == [
        (len(rows), sum(r[2] for r in rows), min(r[1] for r in rows), max(r[1] for r in rows))]
    per_k = router.fan_out("SELECT k, count(*) AS n FROM items GROUP BY k", combine=(None, "sum"), order_by="-n, k")
    counts = {k: sum(1 for r in rows if r[2] == k) for k in {r[2] for r in rows}}
    assert list(per_k) == sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert list(router.fan_out("SELECT k, count(*) AS n FROM items GROUP BY k", combine=(None, "sum"), order_by="k", limit=2)) == sorted(counts.items())[:2]
    per_shard = router.fan_out("SELECT count(*) FROM items", with_shard=True, order_by="shard")
    assert list(per_shard) == sorted(ROWS.items())
    assert router.fan_out("SELECT max(id) FROM items", combine="max", shards=[0, 4]).scalar() is None  # empty shards: NULL
    assert router.fan_out("SELECT count(*) FROM items WHERE id = %s", (rows[-1][1],), combine="sum").scalar() == 1
    with pytest.raises(InputError, match=r"combine names 1 operations for 2 columns \(k, n\)"):
        router.fan_out("SELECT k, count(*) AS n FROM items GROUP BY k", combine=["sum"])
    with pytest.raises(InputError, match="combine 'avg' is not one of sum, min, max"):
        router.fan_out("SELECT avg(k) FROM items", combine="avg")


def test_names_resolve_as_under_router_run(router: Router, spread: Config, rows: list[Row]) -> None:
    """The shard's tables are its own; a table only public has, a CTE named like a shard's table and the shard's
    functions resolve as Router.run's search_path resolves them; a table the shards got after a first fan-out is
    found (the names are read again)."""
    with psycopg.connect(spread.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE public.kinds (k int PRIMARY KEY, label text)")
        c.execute("INSERT INTO kinds VALUES (0, 'zero'), (1, 'one'), (2, 'two'), (3, 'three')")
    q = "SELECT i.id, kinds.label FROM items i JOIN kinds ON kinds.k = i.k"
    by_run = sorted(r for s in range(4) for r in router.run(s, lambda c: c.execute(q).fetchall(), read_only=True))
    assert sorted(router.fan_out(q, shards=range(4))) == by_run and by_run
    assert router.fan_out("WITH items AS (SELECT 1 AS one) SELECT count(*) FROM items", combine="sum").scalar() == SHARDS
    create_in_shards(spread, "DO $$ BEGIN EXECUTE format('CREATE FUNCTION whoami() RETURNS text LANGUAGE sql AS %L',"
                             " format('SELECT %L::text', current_schema())); END $$;")
    assert list(router.fan_out("SELECT whoami()", with_shard=True, order_by="shard")) == [(s, f"shard_{s}") for s in range(SHARDS)]
    create_in_shards(spread, "CREATE TABLE later (v int); INSERT INTO later VALUES (1);")
    assert router.fan_out("SELECT count(*) FROM later", combine="sum").scalar() == SHARDS


def test_refusals_and_failures_name_the_database_and_shards(router: Router, rows: list[Row]) -> None:
    with pytest.raises(InputError, match="a fan-out runs one statement, not 2"):
        router.fan_out("SELECT 1; SELECT 2")
    with pytest.raises(InputError, match="a fan-out runs a SELECT .* on every shard, not CREATE TABLE"):
        router.fan_out("CREATE TABLE x (a int)")
    with pytest.raises(InputError, match="the statement cannot be parsed: syntax error at or near \"SELEC\""):
        router.fan_out("SELEC 1")
    with pytest.raises(InputError, match="shard 8 does not exist"):
        router.fan_out("SELECT 1", shards=[1, 8])
    with pytest.raises(InputError, match="order_by '-id desc' is not a column name"):
        router.fan_out("SELECT id FROM items", order_by="-id desc")
    with pytest.raises(QueryError) as caught:
        router.fan_out("SELECT nope FROM items", shards=[5, 6])
    assert str(caught.value).startswith('the fan-out failed on database db2, shards 5-6, at the statement: column "nope" does not exist [SQLSTATE 42703]')
    assert caught.value.database == "db2" and caught.value.shards == [5, 6] and caught.value.sqlstate == "42703"
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedColumn)
    with pytest.raises(InputError, match=r"the statement is an UPDATE, and the fan-out is read-only: Router.fan_out\(\.\.\., read_only=False\)"):
        router.fan_out("UPDATE items SET k = 9 RETURNING id")
    with pytest.raises(QueryError, match="cannot execute nextval\\(\\) in a read-only transaction"):
        router.fan_out("SELECT next_id()")  # a write by a function: the server's error
    assert router.fan_out("SELECT count(*) FROM items", combine="sum").scalar() == len(rows)  # the pools still work


def test_a_write_fan_out_claims_each_shard_and_returns_what_it_returns(router: Router, spread: Config, rows: list[Row]) -> None:
    changed = router.fan_out("UPDATE items SET note = 'seen' WHERE k = %s RETURNING id", (1,), read_only=False, order_by="id", with_shard=True)
    assert list(changed) == sorted(((r[0], r[1]) for r in rows if r[2] == 1), key=lambda r: r[1])
    assert list(router.fan_out("DELETE FROM items WHERE k = 3", read_only=False)) == []  # no RETURNING: no rows
    assert router.fan_out("SELECT count(*) FROM items WHERE note = 'seen'", combine="sum").scalar() == sum(1 for r in rows if r[2] == 1)
    assert router.fan_out("SELECT count(*) FROM items", combine="sum").scalar() == sum(1 for r in rows if r[2] != 3)
    new = router.fan_out("INSERT INTO items (k) VALUES (7) RETURNING id", read_only=False, with_shard=True)
    assert sorted(shard for shard, _ in new) == list(range(SHARDS))
    assert all(router.shard_of(i) == shard for shard, i in new)  # DEFAULT next_id(): each shard's own


def test_a_fan_out_reads_a_shard_once_when_a_flip_has_the_map_behind(router: Router, spread: Config, rows: list[Row],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard 3 (in db1's second chunk of two) moves to db3 by hand after the Router read the map: the claim on db1
    refuses it; while db3 has not committed it no database serves it and the fan-out waits; then it reads it there,
    once, and db1's other shards once."""
    monkeypatch.setattr(fanout, "CHUNK", 2)
    total = len(rows)
    router.routing_map()
    counts: list[Any] = []

    def fan() -> None:
        try:
            counts.append(router.fan_out("SELECT count(*) FROM items", combine="sum").scalar())
        except BaseException as e:  # noqa: BLE001 - looked at below
            counts.append(e)

    during_freeze: list[int] = []

    def between() -> None:  # db1 retired it and committed; db3 commits after this returns
        t = threading.Thread(target=fan)
        t.start()
        time.sleep(0.5)
        assert counts == [], "no database serves shard 3: the fan-out waits"
        threads.append(t)

    threads: list[threading.Thread] = []
    hand_move(spread, 3, "db1", "db3",
              after_lock=lambda: during_freeze.append(router.fan_out("SELECT count(*) FROM items", combine="sum").scalar()),
              between=between)
    threads[0].join(10)
    assert during_freeze == [total]  # reads pass a cutover's locks: the source, until the flip
    assert counts == [total], counts
    assert router.database_for(3) == "db3" and router.stats["moved"] >= 1
    assert router.fan_out("SELECT count(*) FROM items", combine="sum", shards=[3]).scalar() == ROWS[3]


def test_counts_during_a_batch_move_equal_the_rows_written(spread: Config, rows: list[Row]) -> None:
    """move_shards of shards 0-3 (db1) to db3 in a thread while fan-out counts and newest-rows run again and again:
    every count is the rows written, every newest-rows the reference; the moved shards are read on db3 after."""
    total, newest = len(rows), reference(rows, [(1, True)], 10)
    seen: list[tuple[int, list[Any]]] = []
    with Router(spread, retry_for=30.0) as router:  # listening: follows the move as an application would
        done = threading.Event()
        failed: list[BaseException] = []

        def move() -> None:
            try:
                move_shards(spread, [0, 1, 2, 3], "db3")
            except BaseException as e:  # noqa: BLE001 - looked at below
                failed.append(e)
            finally:
                done.set()

        mover = threading.Thread(target=move)
        mover.start()
        while not done.is_set() or len(seen) < 3:
            count = router.fan_out("SELECT count(*) FROM items", combine="sum").scalar()
            seen.append((count, list(router.fan_out("SELECT id, k, note FROM items", order_by="-id", limit=10, with_shard=True))))
        mover.join()
        assert failed == []
        assert [router.database_for(s) for s in range(SHARDS)] == ["db3"] * 4 + ["db2"] * 4
        assert router.fan_out("SELECT count(*) FROM items", combine="sum", shards=range(4)).scalar() == sum(ROWS[s] for s in range(4))
    assert len(seen) > 3
    assert {count for count, _ in seen} == {total}
    assert all(top == newest for _, top in seen)


def test_a_stopped_database_is_named_or_left_out_with_partial(router: Router, rows: list[Row], db2_server: sandbox.Server) -> None:  # noqa: F811
    router.fan_out("SELECT 1")  # connections to both in the pools
    sandbox.stop(db2_server)
    t0 = time.monotonic()
    with pytest.raises(DatabaseUnavailableError) as caught:
        router.fan_out("SELECT count(*) FROM items", combine="sum")
    assert caught.value.database == "db2" and caught.value.shards == [4, 5, 6, 7]
    assert str(caught.value).startswith("database db2 (") and "is unreachable" in str(caught.value)
    assert "; its shards 4-7 were not read" in str(caught.value)
    res = router.fan_out("SELECT count(*) FROM items", combine="sum", partial=True)
    assert res.scalar() == sum(ROWS[s] for s in range(4)) and res.shards == [0, 1, 2, 3] and not res.complete
    assert [(e.database, e.shards) for e in res.missing] == [("db2", [4, 5, 6, 7])]
    top = router.fan_out("SELECT id, k, note FROM items", order_by="-id", limit=5, partial=True, with_shard=True)
    assert list(top) == reference(rows, [(1, True)], 5, range(4))
    assert time.monotonic() - t0 < 10
    with Router(router.config, listen=False) as late:  # started while db2 is down: the map has never seen its shards
        res = late.fan_out("SELECT count(*) FROM items", combine="sum", partial=True)
        assert res.scalar() == sum(ROWS[s] for s in range(4)) and [(e.database, e.shards) for e in res.missing] == [("db2", [4, 5, 6, 7])]


def test_through_pgbouncer_in_transaction_mode(spread: Config, rows: list[Row], bouncer_root: Path, tmp_path: Path) -> None:  # noqa: F811
    bouncer = pgbouncer.start(bouncer_root, spread.databases, mode="transaction")
    try:
        with Router.from_config(str(app_config(tmp_path, spread, bouncer, None)), listen=False) as router:
            for _ in range(7):  # past psycopg's prepare threshold: through the pooler nothing is prepared
                assert router.fan_out("SELECT count(*) FROM items", combine="sum").scalar() == len(rows)
                assert list(router.fan_out("SELECT id, k, note FROM items", order_by="-id", limit=9, with_shard=True)) == reference(rows, [(1, True)], 9)
            assert router.pools.policy("db1").pooler == "transaction"
    finally:
        bouncer.stop()


def test_async_router_fans_out_the_same(spread: Config, rows: list[Row]) -> None:
    async def main() -> tuple[Any, ...]:
        async with AsyncRouter(spread, listen=False) as router:
            top = await router.fan_out("SELECT id, k, note FROM items", order_by="-id", limit=12, with_shard=True)
            count = await router.fan_out("SELECT count(*) FROM items", combine="sum")
            some = await router.fan_out("SELECT count(*) FROM items WHERE k = %s", (0,), shards=[2, 5], combine="sum")
            return list(top), count.scalar(), some.scalar()

    top, count, some = asyncio.run(main())
    assert top == reference(rows, [(1, True)], 12)
    assert count == len(rows)
    assert some == sum(1 for r in rows if r[0] in (2, 5) and r[2] == 0)
