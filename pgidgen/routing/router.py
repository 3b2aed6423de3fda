"""Router: the facade an application holds. It puts together the map cache (mapcache.py), the pools
(pools.py) and the claimed unit of work (unit.py)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

import psycopg

from ..config import Config, load_config
from ..errors import DatabaseUnavailableError, InputError, RoutingError
from .breaker import CONNECT_TIMEOUT, PROBE_EVERY
from .fanmerge import Combine, FanOutResult
from .fanout import FanOut, Spec
from .keys import ShardKey, modulo, shard_of_id
from .mapcache import MapCache, Route, RoutingMap
from .pools import Pools
from .unit import Units

T = TypeVar("T")
APPLICATION_NAME = "pgidgen-router"


class Router:
    """Routes keys and IDs to shards and shards to databases, and hands out pooled connections there.

    Thread-safe; one per process is plenty. `close()` (or `with Router(...) as router:`) stops the
    listeners and closes the pools.
    """

    def __init__(
        self,
        config: Config,
        *,
        shard_key: ShardKey = modulo,
        search_path: Sequence[str] = ("public",),
        min_size: int = 1,
        max_size: int = 4,
        pool_timeout: float = 10.0,
        retry_for: float = 10.0,
        listen: bool = True,
        max_age: float | None = None,
        application_name: str = APPLICATION_NAME,
        connect_timeout: int = CONNECT_TIMEOUT,
        probe_every: float = PROBE_EVERY,
    ) -> None:
        """search_path: schemas after the shard's own (extensions' types and functions; default public).
        retry_for: how long Router.run keeps retrying a shard that a move is switching over (never one whose
        database is down). listen: LISTEN pgidgen_map on every database's direct connection so moves refresh the
        map at once (where that cannot be done, the map versions are polled every second instead); max_age: poll
        them that often (seconds) anyway.
        connect_timeout: the Router's connections' (whole seconds, at least 2, per address tried), unless the
        connection string or PGCONNECT_TIMEOUT gives one: how long a call may wait to find a database down. Then
        the calls for it fail at once with DatabaseUnavailableError, but for one every probe_every seconds, which
        connects again and, if that works, closes the breaker (pgidgen/routing/breaker.py)."""
        config.select(None)  # no databases configured: say so now
        self.config = config
        self.layout = config.layout
        self.shard_key = shard_key
        self.stats = {"map_loads": 0, "moved": 0, "retries": 0, "unreachable": 0, "probes": 0}
        self.pools = Pools(
            config, min_size=min_size, max_size=max_size, timeout=pool_timeout, application_name=application_name,
            connect_timeout=connect_timeout, probe_every=probe_every, stats=self.stats,
        )
        self.maps = MapCache(
            config,
            pooled=self.pools.connection,
            fresh=self.pools.fresh,
            listen=listen,
            max_age=max_age,
            application_name=application_name,
            stats=self.stats,
            connect_timeout=connect_timeout,
        )
        self.units = Units(config, self.pools, self.maps, search_path=search_path, retry_for=retry_for, stats=self.stats)
        self.fanout = FanOut(config, self.pools, self.maps, self.units)

    @classmethod
    def from_config(cls, path: str | None = None, **options: Any) -> Router:
        """A router for pgidgen.toml (or PGIDGEN_CONFIG, or path)."""
        return cls(load_config(path), **options)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.fanout.close()
        self.maps.close()
        self.pools.close()

    # -- the map -------------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Make the next routing call re-read the map (a listener calls this on NOTIFY pgidgen_map)."""
        self.maps.invalidate()

    def routing_map(self) -> RoutingMap:
        """The current snapshot (re-read when a move announced itself, a route was stale, or max_age passed and
        a database's map version moved)."""
        return self.maps.get()

    @property
    def shard_count(self) -> int:
        return self.maps.shard_count()

    def shard_for(self, key: Any) -> int:
        """The shard a key belongs to: shard_key(key, shard_count), modulo by default."""
        count = self.shard_count
        shard = self.shard_key(key, count)
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < count:
            raise RoutingError(
                f"shard_key({key!r}) returned {shard!r}, not a shard from 0 to {count - 1}",
                hint="a shard_key function must return key's shard in range(shard_count)",
            )
        return shard

    def shard_of(self, id_: int) -> int:
        """The shard an ID was made on (its shard bits)."""
        shard = shard_of_id(self.layout, id_)
        if shard >= self.shard_count:
            raise InputError(
                f"ID {id_} names shard {shard}, but there are only {self.shard_count}",
                hint="it was not made by this pgidgen installation (or the [layout] is wrong)",
            )
        return shard

    def route(self, shard: int) -> Route:
        """Where shard lives now, from the cached map."""
        return self.maps.get().route(shard)

    def database_for(self, shard: int) -> str:
        """The configured name of the database serving shard (from the cached map)."""
        return self.route(shard).database

    # -- units of work -------------------------------------------------------------------------------

    def transaction(self, shard: int, *, read_only: bool = False) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection to the database serving shard, inside a transaction that has claimed the
        shard there (so no move can flip it until the transaction ends) and with search_path = shard_N,
        public for this transaction only. Commits when the block ends, rolls back on an exception; a write unit
        whose transaction a failed statement aborted (its error caught inside) rolls back and raises RoutingError,
        as a COMMIT there would roll back without a word (an expected error: catch it in conn.transaction()).

        read_only: a READ ONLY transaction that checks the shard without taking its claim lock (no transaction ID,
        no WAL); a move under it shows as the renamed schema and is retried like any other.

        Raises ShardMovedError (retryable; nothing was committed) when that database no longer serves the
        shard; a `with` block cannot be re-run, so use Router.run for automatic retries.
        """
        return self.units.transaction(shard, read_only=read_only)

    def run(self, shard: int, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """work(conn) in Router.transaction(shard), run again on the shard's new database when a move flips
        it (for up to retry_for seconds). work must be safe to run again: every failed attempt rolled back.
        Raises DatabaseUnavailableError, without retrying, when the shard's database cannot be connected to
        (within connect_timeout; at once while its breaker holds it down)."""
        return self.units.run(shard, work, read_only=read_only)

    def execute(self, shard: int, query: Any, params: Any = None, *, read_only: bool = False) -> list[Any]:
        """One statement as a unit of work of its own, on the database serving shard: its claim, the statement
        and the commit leave together and come back in one round trip (where Router.run's transaction takes two
        and plain psycopg's three): BEGIN, the claim, the statement and COMMIT in one pipeline. Returns the
        statement's rows ([] when it returns none: add RETURNING to see what was written).

        One statement, sent by the extended protocol even without parameters: a string of several is the server's
        error (42601, "cannot insert multiple commands into a prepared statement"), never run in part after a
        COMMIT among them ended the claim's transaction. What cannot run in a transaction block (VACUUM, CREATE
        INDEX CONCURRENTLY, a procedure that commits) is refused by the server, as in Router.run.

        Retried on the shard's new database when a move flips it, as Router.run, and on a new connection when
        the pooled one is found broken before the write leaves (its server restarted meanwhile). Not retried: a
        write whose connection broke after it was sent (the server may have committed it; the error is raised,
        as psycopg raises it). read_only: as Router.transaction's."""
        return self.units.execute(shard, query, params, read_only=read_only)

    def run_for_key(self, key: Any, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """Router.run on key's shard."""
        return self.run(self.shard_for(key), work, read_only=read_only)

    def run_for_id(self, id_: int, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """Router.run on the shard inside the ID."""
        return self.run(self.shard_of(id_), work, read_only=read_only)

    def fan_out(
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
        """One statement, written unqualified as for Router.run (a SELECT; an INSERT, UPDATE or DELETE with
        read_only=False), on every shard or on shards, in one round trip per database, the databases in parallel;
        the rows merged. Iterate the result for them (tuples).

        order_by: output columns of the statement ("id", "-id" or "id DESC" for descending, several in a list):
        each shard returns its rows in that order, and they are merged into it (text by code point, as COLLATE "C";
        NULLs as PostgreSQL places them). limit: at most that many rows in all, and from each shard. So
        order_by="-id", limit=50 is the 50 newest rows across every shard (IDs are time-ordered).
        combine: "sum", "min" or "max" for every column, or one per column with None for a column to group by:
        the shards' rows combined into one (per group), e.g. combine="sum" on a count(*); order_by and limit
        then apply to the combined rows. with_shard: each row starts with the shard it came from (column "shard").

        Every shard is read exactly once, on the database that serves it at that moment (claimed as Router.run's
        reads are; one a move retired is read again where it lives now, for up to retry_for seconds). Shards are
        read at different moments: not one snapshot. A database that cannot be connected to raises
        DatabaseUnavailableError naming it and its shards; partial=True returns the others' rows instead, with
        result.missing naming what was not read. A statement that fails raises QueryError naming the database
        and the shards (its psycopg error is the __cause__). read_only=False: each shard's write is claimed as
        Router.run's; the shards commit a chunk at a time (pgidgen/routing/fanout.py)."""
        spec = Spec.make(query, params, order_by=order_by, limit=limit, read_only=read_only, with_shard=with_shard,
                         combine=combine, partial=partial)
        return self.fanout.run(spec, shards)

    def fan_out_sql(
        self,
        query: Any,
        params: Any = None,
        *,
        shards: Iterable[int] | None = None,
        order_by: str | Sequence[str] | None = None,
        limit: int | None = None,
        combine: Combine = None,
        read_only: bool = True,
        with_shard: bool = False,
    ) -> dict[str, list[str]]:
        """The rendering twin of fan_out: per database, the SQL fan_out would send it now (one statement a line,
        parameters as literals: BEGIN, the chunk's claims, its statement, COMMIT, per chunk of shards). Runs none
        of it; reads the map and the shard schemas' names."""
        spec = Spec.make(query, params, order_by=order_by, limit=limit, read_only=read_only, with_shard=with_shard, combine=combine)
        return self.fanout.render(spec, shards)

    def search_path_for(self, shard: int) -> str:
        """The search_path value set for shard's transactions: its schema, then the extra ones (quoted)."""
        return self.units.search_path_for(shard)

    # -- databases that are down ---------------------------------------------------------------------

    def check_reachable(self, database: str) -> None:
        """For a unit of work on database outside the Router's pools (the ORM integrations'): raises
        DatabaseUnavailableError at once while its breaker is open, but lets one call every probe_every seconds
        connect to find out whether it is back. Costs a dict lookup while every database answers."""
        if database in self.pools.down:
            self.pools.breaker.let_through(database)

    def connection_lost(self, database: str, error: BaseException) -> DatabaseUnavailableError | None:
        """After a connection to database could not be made or broke with error (a psycopg error): the
        DatabaseUnavailableError to raise instead, its breaker opened, when the database does not answer one
        connect now; None when it does, or error is no lost connection (the error is the work's own)."""
        return self.pools.lost(database, error)

    def _connection(self, name: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection to a database, outside any unit of work (tests, map reads)."""
        return self.pools.connection(name)


def locate(config: Config, *, keys: Sequence[int] = (), ids: Sequence[int] = (), shards: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Where keys, IDs and shards live: shard, database, schema, state (for `pgidgen locate`)."""
    with Router(config, listen=False) as router:
        out: list[dict[str, Any]] = []
        for kind, values, to_shard in (("key", keys, router.shard_for), ("id", ids, router.shard_of), ("shard", shards, lambda s: s)):
            for v in values:
                route = router.route(to_shard(v))
                out.append({kind: v, **route.as_dict()})
        return out


def admin(config: Config) -> Config:
    """config with every database's admin_dsn where the application's would be: a Router of pgidgen's own
    commands connects directly, not through a pooler."""
    return replace(config, app_dsns={}, poolers={}, pooler_prepares=frozenset(), app_unset={})


def query(config: Config, statement: str, *, sql_only: bool = False, **options: Any) -> FanOutResult | dict[str, list[str]]:
    """`pgidgen query`: Router.fan_out of statement through the admin connections (options: fan_out's), or with
    sql_only its rendering twin's SQL per database."""
    with Router(admin(config), listen=False, min_size=0) as router:
        if sql_only:
            options.pop("partial", None)
            return router.fan_out_sql(statement, **options)
        return router.fan_out(statement, **options)


__all__ = ["APPLICATION_NAME", "Router", "admin", "locate", "query"]
