"""The application side: which shard a key or an ID belongs to, which database serves that shard, and a
pooled connection there with the shard's schema first on `search_path`, so unqualified SQL works.

    router = Router.from_config()                  # or Router(config, shard_key=hashed)
    shard = router.shard_for(user_id)              # key % shard_count, or your function
    photo_id = router.run(shard, lambda conn: conn.execute(
        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id", (user_id, "hi")).fetchone()[0])
    with router.transaction(router.shard_of(photo_id)) as conn:   # any ID names its shard
        conn.execute("SELECT * FROM photos WHERE id = %s", (photo_id,))

Never writing to the wrong place. The map is only a cache (the union of every database's `pgidgen.shards`,
refreshed on `NOTIFY pgidgen_map` and whenever a route turns out stale); it decides where to *try*. What
decides whether a write may happen is the target database itself: every routed transaction starts with
`pgidgen.claim_shard(N)`, which locks that database's `pgidgen.shards` row of shard N FOR SHARE and raises
SQLSTATE PGR01 unless the row is 'active' (or 'moving'). A move retires the shard on the old database by
UPDATE-ing that row, and an UPDATE waits for every FOR SHARE holder. So on any one database:
- a transaction that passed the claim holds the row until it ends: the flip commits after it, so its writes
  precede the flip in that database's commit order, and a move that copies everything committed before its
  flip carries them over (the move's side of the contract);
- a transaction that starts after the flip (or waited on the flipping UPDATE) sees 'retired' (READ
  COMMITTED re-reads the updated row; REPEATABLE READ fails with 40001) and writes nothing;
- a statement that reaches the old copy some other way finds the schema renamed (3F000/42P01) or, by its new
  name, move-shard's always-on trigger refusing writes (25006): the helper re-reads the row before blaming the
  move, so a genuinely missing table is still reported as such.
The error is ShardMovedError (retryable); `Router.run` re-reads the map and runs the work again on the database
that serves the shard now. move-shard's cutover takes the row lock (SELECT ... FOR UPDATE of the shard's row)
before it blocks the shard's tables, the same order as routed transactions; in the other order a routed writer
caught between the two would be cancelled by the deadlock detector (still nothing written in the wrong place).
Reads (read_only=True) skip the row lock: a read that overlaps the flip reads the old copy as of the flip.
"""
from __future__ import annotations

import hashlib
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from .catalog import CatalogState, read_state
from .config import Config, describe_dsn, load_config
from .db import CONNECT_TIMEOUT, connect, each_database, pg_message
from .errors import ConflictError, DatabaseError, InputError, PgidgenError, RoutingError, ShardMovedError, ShardUnavailableError
from .idgen import schema_name
from .layout import Layout

T = TypeVar("T")
#: (key, shard_count) -> shard
ShardKey = Callable[[Any, int], int]
#: Raised by pgidgen.claim_shard() when the database does not serve the shard.
NOT_SERVED = "PGR01"
#: Errors a move can cause in a routed transaction: the map is checked again before one is blamed on it.
MOVE_SYMPTOMS = frozenset({NOT_SERVED, "3F000", "42P01", "42883", "25006", "40001", "40P01", "55P03", "57P01"})
SERVING = ("active", "moving")
VERSION_SQL = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgidgen.map_version"
HAS_VERSION_SQL = "SELECT to_regclass('pgidgen.map_version') IS NOT NULL"
NO_CATALOG = -1
APPLICATION_NAME = "pgidgen-router"


def modulo(key: Any, shard_count: int) -> int:
    """Instagram's rule: an integer key (a user_id) lives on shard key % shard_count."""
    if isinstance(key, bool) or not isinstance(key, int):
        raise InputError(
            f"shard key {key!r} is not an integer",
            hint="route integer keys (like a user_id), or give Router(shard_key=hashed) for strings and other keys",
        )
    return key % shard_count


def hashed(key: Any, shard_count: int) -> int:
    """Any key whose str() is stable (strings, UUIDs): a 64-bit BLAKE2b of it, mod shard_count. Stable across
    processes and Python versions, unlike hash()."""
    digest = hashlib.blake2b(str(key).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count


def shard_of_id(layout: Layout, id_: int) -> int:
    """The shard inside an ID (the Python twin of pgidgen.shard_of)."""
    if isinstance(id_, bool) or not isinstance(id_, int):
        raise InputError(f"{id_!r} is not an ID", hint="an ID is a whole number")
    return layout.decode(id_)[1]


@dataclass(frozen=True)
class Route:
    shard: int
    database: str
    schema: str
    state: str

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "database": self.database, "schema": self.schema, "state": self.state}


@dataclass
class RoutingMap:
    """One snapshot of the map: shard -> (database, state), from every reachable database's catalog."""

    shard_count: int
    owners: dict[int, tuple[str, str]] = field(default_factory=dict)
    conflicts: dict[int, list[str]] = field(default_factory=dict)  # shard active in several databases
    versions: dict[str, int] = field(default_factory=dict)  # pgidgen.map_version per database at load
    unreachable: dict[str, str] = field(default_factory=dict)
    loaded_at: float = 0.0


def build_routes(
    config: Config,
    states: Mapping[str, CatalogState],
    versions: Mapping[str, int],
    unreachable: Mapping[str, str],
    previous: RoutingMap | None = None,
) -> RoutingMap:
    """The routing snapshot from the catalogs read. An 'active' row wins over a 'moving' one; two 'active'
    rows are a conflict nobody may write through. Shards last seen on a database that is unreachable now stay
    routed there, so the error names that database instead of claiming the shard is nowhere."""
    counts = {st.shard_count for st in states.values() if st.shard_count is not None}
    if not counts:
        if unreachable:
            name, err = next(iter(unreachable.items()))
            raise DatabaseError(f"no reachable database has a pgidgen catalog; {name}: {err}")
        raise RoutingError(
            "no configured database has a pgidgen catalog", hint="run 'pgidgen init --shards N' first"
        )
    if len(counts) > 1:
        raise ConflictError(
            f"databases disagree on the shard count ({', '.join(str(c) for c in sorted(counts))})",
            hint="run 'pgidgen map' to see which; keys cannot be routed until they agree",
        )
    for name, st in states.items():
        if st.layout is not None and st.layout != config.layout:
            raise ConflictError(
                f"database {name} holds IDs of a different layout than the config",
                hint="IDs would decode to the wrong shard: set [layout] to what 'pgidgen init' installed",
            )
    m = RoutingMap(shard_count=counts.pop(), versions=dict(versions), unreachable=dict(unreachable), loaded_at=time.monotonic())
    claims: dict[int, list[tuple[str, str]]] = {}
    for name, st in states.items():
        for shard, state in st.shards.items():
            if state in SERVING:
                claims.setdefault(shard, []).append((name, state))
    for shard, dbs in claims.items():
        active = [d for d in dbs if d[1] == "active"]
        chosen = active if active else dbs
        if len(chosen) > 1:
            m.conflicts[shard] = [d[0] for d in chosen]
        else:
            m.owners[shard] = chosen[0]
    if previous is not None:
        for shard, (name, state) in previous.owners.items():
            if name in unreachable and shard not in m.owners and shard not in m.conflicts:
                m.owners[shard] = (name, state)
    return m


@contextmanager
def fresh_connection(config: Config, name: str) -> Iterator[psycopg.Connection[Any]]:
    conn = connect(name, config.dsn(name), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def read_catalogs(
    config: Config, *, connection: Callable[[str], Any] | None = None
) -> tuple[dict[str, CatalogState], dict[str, int], dict[str, str]]:
    """Every configured database's map rows and layout (in parallel; not the schema scan `pgidgen map` does):
    states, map versions, and what was unreachable. connection(name): a context manager yielding an autocommit
    connection (a router's pools); a new connection each by default."""

    def work(name: str) -> tuple[CatalogState, int]:
        with (connection or (lambda n: fresh_connection(config, n)))(name) as conn:
            try:
                version = NO_CATALOG
                if conn.execute(HAS_VERSION_SQL).fetchone() == (True,):
                    row = conn.execute(VERSION_SQL).fetchone()  # before the catalog: a change in between re-reads
                    version = int(row[0]) if row else 0
                return read_state(conn, schemas=False), version
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while reading the shard map: {pg_message(e)}") from None

    states: dict[str, CatalogState] = {}
    versions: dict[str, int] = {}
    unreachable: dict[str, str] = {}
    for name, res in each_database(config.select(None), work).items():
        if isinstance(res, PgidgenError):
            unreachable[name] = res.render()
        else:
            states[name], versions[name] = res
    return states, versions, unreachable


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
    ) -> None:
        """search_path: schemas after the shard's own (extensions' types and functions; default public).
        retry_for: how long Router.run keeps retrying a shard that is moving. listen: LISTEN pgidgen_map on
        every database so moves refresh the map at once; max_age: also re-read it when older (seconds)."""
        config.select(None)  # no databases configured: say so now
        self.config = config
        self.layout = config.layout
        self.shard_key = shard_key
        self.search_path = tuple(search_path)
        self.min_size = min_size
        self.max_size = max_size
        self.pool_timeout = pool_timeout
        self.retry_for = retry_for
        self.max_age = max_age
        self.application_name = application_name
        self.stats = {"map_loads": 0, "moved": 0, "retries": 0}
        self._map: RoutingMap | None = None
        self._paths: dict[int, str] = {}
        self._stale = True
        self._lock = threading.Lock()  # one map reader at a time
        self._pool_lock = threading.Lock()
        self._pools: dict[str, ConnectionPool] = {}
        self._closed = False
        self._stop = threading.Event()
        self._listeners: list[threading.Thread] = []
        self._listen = listen

    @classmethod
    def from_config(cls, path: str | None = None, **options: Any) -> Router:
        """A router for pgidgen.toml (or PGIDGEN_CONFIG, or path)."""
        return cls(load_config(path), **options)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        for t in self._listeners:
            t.join(timeout=5)
        with self._pool_lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()

    # -- the map -------------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Make the next routing call re-read the map (a listener calls this on NOTIFY pgidgen_map)."""
        self._stale = True

    def routing_map(self) -> RoutingMap:
        """The current snapshot, re-read first if a move announced itself, a route was stale, or (max_age)
        a database's pgidgen.map_version moved. While one thread re-reads it, the others keep routing by the
        previous snapshot: the claim, not the map, is what keeps writes in the right place."""
        m = self._map
        if m is not None and not self._stale and (self.max_age is None or time.monotonic() - m.loaded_at < self.max_age):
            return m
        if not self._lock.acquire(blocking=m is None):
            return m  # type: ignore[return-value]  # m is not None here: someone else is re-reading
        try:
            if self._closed:
                raise RoutingError("this Router is closed", hint="create a new one")
            m = self._map
            if m is not None and not self._stale and self.max_age is not None and time.monotonic() - m.loaded_at >= self.max_age:
                if not self._versions_moved(m):
                    m.loaded_at = time.monotonic()
                    return m
                self._stale = True
            if m is None or self._stale:
                if self._listen and not self._listeners:
                    self._start_listeners()
                self._stale = False  # before reading: a NOTIFY during the read marks it stale again
                try:
                    states, versions, unreachable = read_catalogs(self.config, connection=self._map_connection)
                    m = build_routes(self.config, states, versions, unreachable, previous=self._map)
                except PgidgenError:
                    self._stale = True
                    raise
                self._map = m
                self.stats["map_loads"] += 1
            return m
        finally:
            self._lock.release()

    def _map_connection(self, name: str) -> Any:
        """The pool for a database that answered last time (a re-read costs ~1 ms), a new connection otherwise
        (one that is down fails at once instead of waiting pool_timeout)."""
        m = self._map
        if m is not None and name in m.versions:
            return self._connection(name)
        return fresh_connection(self.config, name)

    def _versions_moved(self, m: RoutingMap) -> bool:
        """Whether any database's pgidgen.map_version differs from the snapshot's (one tiny query each, on the
        pools). The sequence moves when the map changes, before that change commits: a poll in between keeps
        the old map with the new version, and the first write there gets ShardMovedError and re-reads it."""
        for name in self.config.select(None):
            if name not in m.versions:
                return True  # unreachable at the last read: read everything again
            try:
                with self._connection(name) as conn:
                    if m.versions[name] == NO_CATALOG:
                        if conn.execute(HAS_VERSION_SQL).fetchone() == (True,):
                            return True
                        continue
                    row = conn.execute(VERSION_SQL).fetchone()
            except (psycopg.Error, PgidgenError):
                return True
            if row is None or int(row[0]) != m.versions[name]:
                return True
        return False

    @property
    def shard_count(self) -> int:
        return self.routing_map().shard_count

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
        m = self.routing_map()
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < m.shard_count:
            raise InputError(f"shard {shard!r} does not exist", hint=f"shards are numbered 0 to {m.shard_count - 1}")
        if shard in m.conflicts:
            raise RoutingError(
                f"shard {shard} is active in more than one database: {', '.join(m.conflicts[shard])}",
                hint="nothing is written until 'pgidgen map' shows it in exactly one",
            )
        owner = m.owners.get(shard)
        if owner is None:
            down = f"; unreachable: {', '.join(m.unreachable)}" if m.unreachable else ""
            raise ShardUnavailableError(
                f"no database serves shard {shard} right now{down}",
                hint="a move may be switching it over (retry), or see 'pgidgen map'",
            )
        return Route(shard=shard, database=owner[0], schema=schema_name(shard), state=owner[1])

    def database_for(self, shard: int) -> str:
        """The configured name of the database serving shard (from the cached map)."""
        return self.route(shard).database

    # -- connections ---------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, shard: int, *, read_only: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the database serving shard, inside a transaction that has claimed the
        shard there (so no move can flip it until the transaction ends) and with search_path = shard_N,
        public for this transaction only. Commits when the block ends, rolls back on an exception.

        read_only: a READ ONLY transaction that checks the shard without locking its row (no transaction ID,
        no WAL); a move under it shows as the renamed schema and is retried like any other.

        Raises ShardMovedError (retryable; nothing was committed) when that database no longer serves the
        shard; a `with` block cannot be re-run, so use Router.run for automatic retries.
        """
        route = self.route(shard)
        with self._connection(route.database) as conn:
            claimed = False
            try:
                with conn.transaction():
                    self._claim(conn, route, read_only)
                    claimed = True
                    yield conn
            except psycopg.Error as e:
                if not claimed and conn.broken:  # a pooled connection the server dropped (restart, terminate)
                    raise ShardUnavailableError(
                        f"the connection to database {route.database} broke before the transaction began: {pg_message(e)}",
                        hint="nothing was written; Router.run retries with a new connection",
                    ) from e
                moved = self._diagnose(conn, route, e)
                if moved is None:
                    raise
                raise moved from e

    def run(self, shard: int, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """work(conn) in Router.transaction(shard), run again on the shard's new database when a move flips
        it (for up to retry_for seconds). work must be safe to run again: every failed attempt rolled back."""
        deadline = time.monotonic() + self.retry_for
        delay = 0.005
        while True:
            try:
                with self.transaction(shard, read_only=read_only) as conn:
                    return work(conn)
            except (ShardMovedError, ShardUnavailableError) as e:
                stale = e.database if isinstance(e, ShardMovedError) else None
                self.invalidate()
                if time.monotonic() >= deadline:
                    raise
                self.stats["retries"] += 1
                try:
                    again = self.route(shard).database == stale
                except ShardUnavailableError:
                    again = True
                if again:  # the map has not caught up with the move yet: wait for it
                    time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, 0.25)

    def run_for_key(self, key: Any, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """Router.run on key's shard."""
        return self.run(self.shard_for(key), work, read_only=read_only)

    def run_for_id(self, id_: int, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False) -> T:
        """Router.run on the shard inside the ID."""
        return self.run(self.shard_of(id_), work, read_only=read_only)

    def search_path_for(self, shard: int) -> str:
        """The search_path value set for shard's transactions: its schema, then the extra ones (quoted)."""
        path = self._paths.get(shard)
        if path is None:
            path = sql.SQL(", ").join(sql.Identifier(s) for s in (schema_name(shard), *self.search_path)).as_string(None)
            self._paths[shard] = path
        return path

    def _claim(self, conn: psycopg.Connection[Any], route: Route, read_only: bool) -> None:
        path = self.search_path_for(route.shard)
        if read_only:
            conn.execute(
                "SELECT pgidgen.claim_shard(%s, false), pg_catalog.set_config('search_path', %s, true),"
                " pg_catalog.set_config('transaction_read_only', 'on', true)",
                (route.shard, path),
            )
        else:
            conn.execute("SELECT pgidgen.claim_shard(%s), pg_catalog.set_config('search_path', %s, true)", (route.shard, path))

    def _diagnose(self, conn: psycopg.Connection[Any], route: Route, e: psycopg.Error) -> PgidgenError | None:
        """The error to raise instead of e, if e means the shard is not (or no longer) served there."""
        state = getattr(e, "sqlstate", None)
        where = f"{route.database}, {describe_dsn(self.config.dsn(route.database))}"
        if state == "42883" and "claim_shard" in (getattr(e.diag, "message_primary", None) or ""):
            return DatabaseError(
                f"database {route.database} has a pgidgen catalog without pgidgen.claim_shard()",
                where=where,
                hint="upgrade it: run pgidgen's sql/catalog.sql there (idempotent)",
            )
        if state not in MOVE_SYMPTOMS:
            return None
        served = state != NOT_SERVED and self._still_serves(conn, route)
        if served:
            return None
        self.invalidate()
        self.stats["moved"] += 1
        return ShardMovedError(
            f"database {route.database} no longer serves shard {route.shard}; nothing was written there",
            shard=route.shard,
            database=route.database,
            where=where,
            hint="the shard moved: Router.run retries on the database that serves it now",
        )

    def _still_serves(self, conn: psycopg.Connection[Any], route: Route) -> bool:
        """The database's own row, read again after the failed transaction (not the cached map)."""
        query = "SELECT state FROM pgidgen.shards WHERE shard = %s"
        try:
            if conn.broken or conn.closed:
                with connect(route.database, self.config.dsn(route.database), autocommit=True) as fresh:
                    row = fresh.execute(query, (route.shard,)).fetchone()
            else:
                row = conn.execute(query, (route.shard,)).fetchone()
        except (psycopg.Error, PgidgenError):
            return True  # cannot tell: report the original error, not a move
        return row is not None and row[0] in SERVING

    @contextmanager
    def _connection(self, name: str) -> Iterator[psycopg.Connection[Any]]:
        pool = self._pool(name)
        try:
            with pool.connection(timeout=self.pool_timeout) as conn:
                yield conn
        except PoolTimeout:
            raise DatabaseError(
                f"no connection to database {name} ({describe_dsn(self.config.dsn(name))}) within {self.pool_timeout:g}s",
                hint="check that the server is running and accepts connections, or raise max_size",
            ) from None

    def _pool(self, name: str) -> ConnectionPool:
        pool = self._pools.get(name)
        if pool is not None:
            return pool
        with self._pool_lock:
            if self._closed:
                raise RoutingError("this Router is closed", hint="create a new one")
            pool = self._pools.get(name)
            if pool is None:
                pool = ConnectionPool(
                    self.config.dsn(name),
                    min_size=self.min_size,
                    max_size=self.max_size,
                    kwargs={"autocommit": True, "application_name": self.application_name, "connect_timeout": CONNECT_TIMEOUT},
                    name=f"pgidgen-{name}",
                    open=True,
                )
                self._pools[name] = pool
        return pool

    # -- listening for moves ---------------------------------------------------------------------------

    def _start_listeners(self) -> None:
        """One thread per database, LISTENing before the first read of the map, so no move is missed."""
        ready: list[threading.Event] = []
        for name in self.config.select(None):
            ev = threading.Event()
            t = threading.Thread(target=self._listen_loop, args=(name, ev), name=f"pgidgen-listen-{name}", daemon=True)
            t.start()
            self._listeners.append(t)
            ready.append(ev)
        for ev in ready:
            ev.wait(timeout=CONNECT_TIMEOUT)

    def _listen_loop(self, name: str, ready: threading.Event) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.config.dsn(name), autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name=self.application_name
                ) as conn:
                    conn.execute("LISTEN pgidgen_map")
                    self.invalidate()  # whatever happened while not listening
                    ready.set()
                    backoff = 0.1
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.2):
                            self.invalidate()
            except (psycopg.Error, PgidgenError):  # PgidgenError: its ${VAR} is not set (config.dsn)
                ready.set()  # unreachable now: the map says so; reconnecting (above) re-reads it
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


def locate(config: Config, *, keys: Sequence[int] = (), ids: Sequence[int] = (), shards: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Where keys, IDs and shards live: shard, database, schema, state (for `pgidgen locate`)."""
    with Router(config, listen=False) as router:
        out: list[dict[str, Any]] = []
        for kind, values, to_shard in (("key", keys, router.shard_for), ("id", ids, router.shard_of), ("shard", shards, lambda s: s)):
            for v in values:
                route = router.route(to_shard(v))
                out.append({kind: v, **route.as_dict()})
        return out
