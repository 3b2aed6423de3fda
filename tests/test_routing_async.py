"""AsyncRouter on real servers: a writer on asyncio through a real move-shard, direct and through PgBouncer in
transaction mode: no exception reaches it, every acknowledged write is stored once where the shard lives; a
stale route raises ShardMovedError and writes nothing there."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_routing import count, hand_move
from test_routing import sharded as sharded_8  # noqa: F401 - a fixture, taken by name as a parameter
from test_routing_pooler import app_config, bouncer_root, sharded  # noqa: F401 - fixture

from pgidgen import pgbouncer
from pgidgen.config import Config, load_config
from pgidgen.errors import RoutingError, ShardMovedError
from pgidgen.move import move_shard
from pgidgen.routing import AsyncRouter, Router


async def insert(conn: psycopg.AsyncConnection[Any], n: int) -> int:
    cur = await conn.execute("INSERT INTO t (v) VALUES (%s) RETURNING id", (n,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def write_during_a_move(router: AsyncRouter, admin: Config) -> tuple[list[int], list[BaseException]]:
    ids: list[int] = []
    errors: list[BaseException] = []
    moved = threading.Event()

    async def writer(k: int) -> None:
        n = 0
        while not moved.is_set() or n < 30:
            try:
                ids.append(await router.run(1, lambda c: insert(c, n)))  # noqa: B023 - run within this iteration
            except Exception as e:  # noqa: BLE001 - every exception the application would see
                errors.append(e)
            n += 1

    async def mover() -> None:
        while len(ids) < 50:
            await asyncio.sleep(0.01)
        report = await asyncio.to_thread(move_shard, admin, 1, "db3")
        assert report.status == "done" and report.verification is not None and report.verification.ok
        moved.set()

    await asyncio.gather(mover(), *(writer(k) for k in range(3)))
    return ids, errors


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_an_async_writer_during_a_move_sees_nothing(through: str, config: Config, bouncer_root: Path, tmp_path: Path) -> None:
    sharded(config)
    bouncer = pgbouncer.start(bouncer_root, config.databases, mode="transaction") if through == "pgbouncer" else None

    async def main() -> tuple[list[int], list[BaseException], str]:
        app = load_config(app_config(tmp_path, config, bouncer, None)) if bouncer else config
        async with AsyncRouter(app) as router:
            ids, errors = await write_during_a_move(router, config)
            return ids, errors, await router.database_for(1)

    try:
        ids, errors, now = asyncio.run(main())
    finally:
        if bouncer:
            bouncer.stop()
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    assert now == "db3"
    with psycopg.connect(config.dsn("db3")) as c:
        stored = sorted(r[0] for r in c.execute("SELECT id FROM shard_1.t WHERE id = ANY(%s)", (ids,)))
    assert len(ids) > 100 and len(set(ids)) == len(ids) and stored == sorted(ids)


def test_a_stale_async_route_raises_shard_moved_and_writes_nothing_there(sharded_8: Config) -> None:
    async def main() -> None:
        async with AsyncRouter(sharded_8, listen=False) as router:
            assert await router.database_for(3) == "db1"
            retired = await asyncio.to_thread(hand_move, sharded_8, 3, "db1", "db3")
            with pytest.raises(ShardMovedError):
                async with router.transaction(3) as conn:
                    await conn.execute("INSERT INTO items (k) VALUES (3)")
            assert count(sharded_8.dsn("db1"), retired) == 0
            await router.run(3, lambda c: c.execute("INSERT INTO items (k) VALUES (3)"))  # retried on db3
            assert await router.database_for(3) == "db3" and router.stats["moved"] == 1
            async with router.transaction(3, read_only=True) as conn:
                assert await (await conn.execute("SHOW search_path")).fetchone() == ('"shard_3", "public"',)

    asyncio.run(main())
    assert count(sharded_8.dsn("db3"), "shard_3") == 1


def test_shard_for_reads_nothing_on_the_event_loop_when_the_map_is_stale(sharded_8: Config) -> None:
    """shard_for and shard_of are not coroutines: once a map was read they answer from the shard count (fixed at
    init), where a stale map (after every move, or every max_age behind a pooler) made them read the catalogs of
    every database on the event loop, blocking every other task."""
    async def main() -> None:
        async with AsyncRouter(sharded_8, listen=False) as router:
            await router.routing_map()
            loads = router.stats["map_loads"]
            router.invalidate()
            assert router.shard_for(11) == 3 and router.shard_of(await router.run(3, lambda c: _id(c))) == 3
            assert router.stats["map_loads"] == loads + 1  # the unit of work re-read it, off the event loop
            router.invalidate()
            assert router.shard_for(12) == 4
            assert router.stats["map_loads"] == loads + 1

    asyncio.run(main())


async def _id(conn: psycopg.AsyncConnection[Any]) -> int:
    return (await (await conn.execute("INSERT INTO items (k) VALUES (3) RETURNING id")).fetchone())[0]  # type: ignore[index]


def test_a_write_unit_whose_work_caught_a_statements_error_raises_and_is_not_reported_written(sharded_8: Config) -> None:
    """A statement that fails aborts the transaction; work that catches its error and returns used to be reported
    as done (run returned the ID it had inserted) while the unit's COMMIT rolled everything back without a word.
    Router and AsyncRouter alike; a read-only unit has nothing to lose and returns."""
    def caught(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("INSERT INTO items (k) VALUES (3) RETURNING id").fetchone()
        try:
            conn.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass
        return int(row[0])  # type: ignore[index]

    async def async_caught(conn: psycopg.AsyncConnection[Any]) -> int:
        row = await (await conn.execute("INSERT INTO items (k) VALUES (3) RETURNING id")).fetchone()
        try:
            await conn.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass
        return int(row[0])  # type: ignore[index]

    aborted = "failed and the work went on: its transaction was aborted there, so nothing of it was committed"
    with Router(sharded_8, listen=False, max_size=1) as router:
        with pytest.raises(RoutingError, match=aborted):
            router.run(3, caught)
        with pytest.raises(RoutingError, match=aborted), router.transaction(3) as conn:
            caught(conn)
        assert router.run(3, lambda c: c.execute("SELECT count(*) FROM items").fetchone()) == (0,)  # the connection is fine
        with router.transaction(3, read_only=True) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")

    async def main() -> None:
        async with AsyncRouter(sharded_8, listen=False, max_size=1) as router:
            with pytest.raises(RoutingError, match=aborted):
                await router.run(3, async_caught)
            with pytest.raises(RoutingError, match=aborted):
                async with router.transaction(3) as conn:
                    await async_caught(conn)
            assert await router.execute(3, "SELECT count(*) FROM items") == [(0,)]
            async with router.transaction(3, read_only=True) as conn:
                with pytest.raises(psycopg.errors.DivisionByZero):
                    await conn.execute("SELECT 1 / 0")

    asyncio.run(main())
    assert count(sharded_8.dsn("db1"), "shard_3") == 0
