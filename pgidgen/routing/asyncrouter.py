"""AsyncRouter: the Router for asyncio applications, with the same guarantee and the same parts. Units of work
run on psycopg's async connections and pools (AsyncClaimingConnection: the claim with the first statement); the
map cache, its LISTEN threads and its rare re-reads are the sync Router's, run off the event loop, and so is its
breaker (a database down fails its calls at once; the probe that finds it back connects in a thread)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ..config import Config, load_config
from ..db import pg_message
from ..errors import DatabaseUnavailableError, RoutingError, ShardMovedError, ShardUnavailableError
from .breaker import no_answer
from .claiming import AsyncClaimingConnection, async_has_claim_call
from .fanmerge import Combine, FanOutResult
from .fanout import Outcome, Rounds, Spec, read_gen
from .mapcache import SERVING, Route, RoutingMap
from .router import Router
from .unit import aborted, needs_row, next_try, verdict

T = TypeVar("T")
IDLE = TransactionStatus.IDLE
INERROR = TransactionStatus.INERROR


class _AsyncPool(AsyncConnectionPool[AsyncClaimingConnection]):
    """pools._Pool for asyncio: tells the breaker when a connect of the pool's own got no answer."""

    def __init__(self, *args: Any, lost: Callable[[_AsyncPool, BaseException], None], **kwargs: Any) -> None:
        self.lost = lost
        super().__init__(*args, **kwargs)

    async def _connect(self, timeout: float | None = None) -> AsyncClaimingConnection:
        try:
            return await super()._connect(timeout)
        except psycopg.OperationalError as e:
            if no_answer(e):
                self.lost(self, e)
            raise


class AsyncRouter:
    """Router's API for asyncio: `await router.run(shard, work)` where `work(conn)` is a coroutine function on a
    psycopg AsyncConnection; `async with router.transaction(shard) as conn:`. Routing (`shard_for`, `shard_of`,
    `database_for`) is the same as Router's and needs no await. `await router.close()` at the end."""

    def __init__(self, config: Config, *, min_size: int = 1, max_size: int = 4, **options: Any) -> None:
        """options: Router's (shard_key, search_path, pool_timeout, retry_for, listen, max_age, application_name)."""
        # the map side: a sync Router whose own pool (one connection a database) only serves map reads
        self.sync = Router(config, min_size=0, max_size=1, **options)
        self.config = config
        self.stats = self.sync.stats
        self.maps = self.sync.maps
        self.units = self.sync.units
        self.min_size = min_size
        self.max_size = max_size
        self.pool_timeout = self.sync.pools.timeout
        self._first_wait = min(0.05, self.pool_timeout)  # then in slices, looking at the breaker in between
        self.retry_for = self.units.retry_for
        self.breaker = self.sync.pools.breaker
        self.down = self.breaker.down
        self._pools: dict[str, _AsyncPool] = {}
        self._dropped: list[_AsyncPool] = []  # pools of databases that went down, to close on the loop
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.breaker.on_trip(self._drop)

    @classmethod
    def from_config(cls, path: str | None = None, **options: Any) -> AsyncRouter:
        return cls(load_config(path), **options)

    async def __aenter__(self) -> AsyncRouter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the async pools, then the map side (its listeners and pool)."""
        pools, self._pools = [*self._pools.values(), *self._dropped], {}
        self._dropped = []
        await asyncio.gather(*(p.close() for p in pools), *self._closing)
        await asyncio.to_thread(self.sync.close)

    # -- routing: the sync Router's, the map read off the event loop when it must be read ---------------

    def shard_for(self, key: Any) -> int:
        return self.sync.shard_for(key)

    def shard_of(self, id_: int) -> int:
        return self.sync.shard_of(id_)

    async def routing_map(self) -> RoutingMap:
        peeked = self.maps.peek()
        return peeked if peeked else await asyncio.to_thread(self.maps.get)

    async def route(self, shard: int) -> Route:
        return (await self.routing_map()).route(shard)

    async def database_for(self, shard: int) -> str:
        return (await self.route(shard)).database

    def invalidate(self) -> None:
        self.maps.invalidate()

    # -- units of work ---------------------------------------------------------------------------------

    def transaction(self, shard: int, *, read_only: bool = False) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """As Router.transaction."""
        return self._unit(shard, read_only, False)

    @asynccontextmanager
    async def _unit(self, shard: int, read_only: bool, with_commit: bool) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A claimed unit of work; with_commit: one statement whose COMMIT travels with it (execute)."""
        route = await self.route(shard)
        if route.database in self.down and self.breaker.admit(route.database):  # down: fails at once, but for a probe
            await asyncio.to_thread(self.breaker.probe, route.database)
        pool = await self._pool(route.database)
        try:
            conn = await pool.getconn(timeout=self._first_wait)
        except (PoolTimeout, PoolClosed):
            pool, conn = await self._wait_for_connection(route.database)
        try:
            conn.begin_unit(self.units.claim_for(shard, read_only), with_commit)
            committing = False
            try:
                yield conn
                if conn.end_unit():
                    status = conn.pgconn.transaction_status
                    if status != IDLE:
                        if status == INERROR and not read_only:
                            raise aborted(route.shard)  # (unit.aborted says why)
                        committing = True
                        await conn.commit_unit()
            except BaseException as e:
                conn.end_unit()
                # a write sent with its COMMIT (execute): a connection that broke meanwhile may have committed it
                committing = committing or (conn.commit_sent and not read_only)
                if not conn.broken and conn.pgconn.transaction_status != IDLE:
                    try:
                        await conn.rollback()
                    except psycopg.Error:
                        pass
                if not isinstance(e, psycopg.Error):
                    raise
                if conn.broken and committing:  # the COMMIT left: whether it was applied no one can tell
                    raise
                if conn.broken:  # as Router's: a server that is gone fails it, else a new connection
                    down = await asyncio.to_thread(self.sync.pools.lost, route.database)
                    if down is not None:
                        raise down from e
                    raise ShardUnavailableError(
                        f"the connection to database {route.database} broke before the transaction committed: {pg_message(e)}",
                        hint="nothing was written; AsyncRouter.run retries with a new connection",
                    ) from e
                served = needs_row(e) and await self._still_serves(conn, route)
                moved = verdict(self.units, route, e, served=served)
                if moved is None:
                    raise
                raise moved from e
        finally:
            await pool.putconn(conn)

    async def run(self, shard: int, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *, read_only: bool = False) -> T:
        """As Router.run: await work(conn) in a claimed transaction, again on the shard's new database after a move."""
        return await self._retried(shard, work, read_only, False)

    async def execute(self, shard: int, query: Any, params: Any = None, *, read_only: bool = False) -> list[Any]:
        """As Router.execute: one statement as a unit of work of its own, its commit sent with it; its rows."""
        async def one(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = conn.cursor()
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description is not None else []

        return await self._retried(shard, one, read_only, True)

    async def _retried(self, shard: int, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], read_only: bool, with_commit: bool) -> T:
        deadline = time.monotonic() + self.retry_for
        delay = 0.005
        while True:
            try:
                async with self._unit(shard, read_only, with_commit) as conn:
                    return await work(conn)
            except (ShardMovedError, ShardUnavailableError) as e:
                wait, delay = await asyncio.to_thread(next_try, self.units, shard, e, deadline, delay)
                if wait:
                    await asyncio.sleep(wait)

    async def run_for_key(self, key: Any, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *, read_only: bool = False) -> T:
        return await self.run(self.shard_for(key), work, read_only=read_only)

    async def run_for_id(self, id_: int, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *, read_only: bool = False) -> T:
        return await self.run(self.shard_of(id_), work, read_only=read_only)

    async def fan_out(
        self,
        query: Any,
        params: Any = None,
        *,
        shards: Iterable[int] | None = None,
        order_by: str | Sequence[str] | None = None,
        limit: int | None = None,
        combine: Combine = None,
        read_only: bool = True,
        partial: bool = False,
        with_shard: bool = False,
    ) -> FanOutResult:
        """As Router.fan_out: the databases as tasks on the event loop."""
        spec = Spec.make(query, params, order_by=order_by, limit=limit, read_only=read_only, with_shard=with_shard,
                         combine=combine, partial=partial)
        rounds = Rounds(self.sync.fanout, spec, shards, await self.routing_map())
        while rounds.pending:
            by_database = rounds.plan(await self.routing_map())
            done = await asyncio.gather(*(self._fan_read(name, part, spec) for name, part in by_database.items()), return_exceptions=True)
            wait = rounds.settle(dict(zip(by_database, done, strict=True)))
            if wait:
                await asyncio.sleep(wait)
        return rounds.result()

    async def _fan_read(self, name: str, shards: list[int], spec: Spec) -> Outcome:
        """One database's part of a fan-out's round (fanout.read_gen) on a connection of its pool."""
        try:
            if name in self.down and self.breaker.admit(name):
                await asyncio.to_thread(self.breaker.probe, name)
            pool = await self._pool(name)
            try:
                conn = await pool.getconn(timeout=self._first_wait)
            except (PoolTimeout, PoolClosed):
                pool, conn = await self._wait_for_connection(name)
        except DatabaseUnavailableError as ex:
            return Outcome(error=ex)
        sent: list[bool] = []
        try:
            async with conn.lock:
                return await psycopg.AsyncConnection.wait(conn, read_gen(self.sync.fanout, conn, name, shards, spec, sent))
        except psycopg.Error as ex:
            down = await asyncio.to_thread(self.sync.pools.lost, name) if conn.broken else None
            return self.sync.fanout.broken(conn, name, shards, spec, sent, ex, lambda _: down)
        finally:
            await pool.putconn(conn)

    async def _still_serves(self, conn: psycopg.AsyncConnection[Any], route: Route) -> bool:
        if conn.broken or conn.closed:
            # a fresh sync connection: of this one, _still_serves reads only that it is broken or closed
            return await asyncio.to_thread(self.units._still_serves, conn, route)  # type: ignore[arg-type]
        try:
            cur = await conn.execute("SELECT state FROM pgidgen.shards WHERE shard = %s", (route.shard,))
            row = await cur.fetchone()
        except psycopg.Error:
            return True
        return row is not None and row[0] in SERVING

    async def _wait_for_connection(self, name: str) -> tuple[_AsyncPool, AsyncClaimingConnection]:
        """No connection at once: wait for one up to pool_timeout, but fail as soon as the database is found down."""
        deadline = time.monotonic() + self.pool_timeout
        while True:
            if name in self.down:
                raise self.breaker.error(name)
            pool = await self._pool(name)
            try:
                return pool, await pool.getconn(timeout=max(0.001, min(0.05, deadline - time.monotonic())))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise self.sync.pools._timeout(name) from None
            except PoolClosed:  # dropped meanwhile: the database went down, or the router closed
                pass

    def _drop(self, name: str) -> None:
        """The breaker's on_trip (any thread): the pool of a database that went down is made anew when it is back."""
        pool = self._pools.pop(name, None)
        if pool is not None:
            self._dropped.append(pool)

    def _pool_lost(self, name: str, pool: _AsyncPool, e: BaseException) -> None:
        if self._pools.get(name) is pool:
            self.breaker.trip(name, e)

    async def _pool(self, name: str) -> _AsyncPool:
        pool = self._pools.get(name)
        if pool is not None:
            return pool
        while self._dropped:  # closed on the loop, meanwhile: their connections close as they come back
            task = asyncio.ensure_future(self._dropped.pop().close(timeout=self.sync.pools.connect_timeout + 1.0))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        policy = await asyncio.to_thread(self.sync.pools.policy, name)
        async with self._lock:
            if name not in self._pools:
                if self.sync.pools._closed:
                    raise RoutingError("this AsyncRouter is closed", hint="create a new one")
                if name in self.down:  # as Pools._open
                    raise self.breaker.error(name)
                pool = _AsyncPool(
                    self.config.app_dsn(name), min_size=self.min_size, max_size=self.max_size,
                    kwargs=policy.connect_kwargs(self.sync.pools.application_name), name=f"pgidgen-async-{name}",
                    connection_class=AsyncClaimingConnection, configure=async_has_claim_call, open=False,
                    lost=partial(self._pool_lost, name),
                )
                self._pools[name] = pool
                await pool.open()
            return self._pools[name]
