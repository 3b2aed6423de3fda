"""The map cache: where each shard is served, read from every database's own `pgidgen.shards`, and kept fresh by
LISTEN pgidgen_map (on each database's direct connection) or by polling `pgidgen.map_version`. The map only
decides where to *try*; the claim (unit.py) decides whether a write may happen."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..catalog import CatalogState, no_catalog_hint, read_state, uncatalogued
from ..config import Config
from ..db import connect, each_database, pg_message, timeout_for
from ..errors import (
    ConflictError,
    DatabaseError,
    DatabaseUnavailableError,
    InputError,
    PgidgenError,
    RoutingError,
    ShardUnavailableError,
)
from ..idgen import schema_name
from .breaker import CONNECT_TIMEOUT
from .pools import behind_pooler

SERVING = ("active", "moving")
VERSION_SQL = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgidgen.map_version"
HAS_VERSION_SQL = "SELECT to_regclass('pgidgen.map_version') IS NOT NULL"
NO_CATALOG = -1
#: How often the map versions are polled while some database cannot be listened to (seconds).
DEAF_POLL = 1.0

#: name -> a context manager yielding an autocommit connection to that database
Connector = Callable[[str], AbstractContextManager[psycopg.Connection[Any]]]


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
    #: shards a reachable database is being filled with ('incoming'): a move is switching them over
    switching: set[int] = field(default_factory=set)
    #: databases read that have no pgidgen catalog (named when a shard is served nowhere)
    uncatalogued: list[str] = field(default_factory=list)
    loaded_at: float = 0.0
    _routes: dict[int, Route] = field(default_factory=dict, repr=False, compare=False)

    def route(self, shard: int) -> Route:
        route = self._routes.get(shard)  # a snapshot never changes: each route is built once
        if route is None:
            route = self._routes[shard] = self._route(shard)
        return route

    def _route(self, shard: int) -> Route:
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < self.shard_count:
            raise InputError(f"shard {shard!r} does not exist", hint=f"shards are numbered 0 to {self.shard_count - 1}")
        if shard in self.conflicts:
            raise RoutingError(
                f"shard {shard} is active in more than one database: {', '.join(self.conflicts[shard])}",
                hint="nothing is written until 'pgidgen map' shows it in exactly one",
            )
        owner = self.owners.get(shard)
        if owner is None:
            down = ", ".join(self.unreachable)
            if down and shard not in self.switching:  # not a move's doing: not worth retrying
                raise DatabaseUnavailableError(
                    f"database {down} is unreachable, and no other database serves shard {shard}",
                    database=next(iter(self.unreachable)),
                    hint="the shard is most likely there: check that its server is running and accepts connections"
                    " ('pgidgen map' shows where each shard is)",
                )
            why = f"; unreachable: {down}" if down else ""
            hint = "a move may be switching it over (retry), or see 'pgidgen map'"
            if self.uncatalogued and not down:  # a new database, or one whose connection string reaches another
                why = f"; no pgidgen catalog in {', '.join(self.uncatalogued)}"
                hint = f"a move may be switching it over (retry); if it lasts, {no_catalog_hint(' or '.join(self.uncatalogued), self.shard_count)}"
            raise ShardUnavailableError(f"no database serves shard {shard} right now{why}", hint=hint)
        return Route(shard=shard, database=owner[0], schema=schema_name(shard), state=owner[1])


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
    m = RoutingMap(shard_count=counts.pop(), versions=dict(versions), unreachable=dict(unreachable), uncatalogued=uncatalogued(states),
                   loaded_at=time.monotonic())
    owners = m.owners  # a shard claimed once (nearly all) is owned at once; one claimed by several, below
    several: dict[int, list[tuple[str, str]]] = {}
    for name, st in states.items():
        for shard, state in st.shards.items():
            if state in SERVING:
                first = owners.setdefault(shard, (name, state))
                if first[0] != name:
                    several.setdefault(shard, [first]).append((name, state))
            elif state == "incoming":
                m.switching.add(shard)
    for shard, dbs in several.items():
        del owners[shard]
        active = [d for d in dbs if d[1] == "active"]
        chosen = active if active else dbs
        if len(chosen) > 1:
            m.conflicts[shard] = [d[0] for d in chosen]
        else:
            owners[shard] = chosen[0]
    if previous is not None:
        for shard, (name, state) in previous.owners.items():
            if name in unreachable and shard not in m.owners and shard not in m.conflicts:
                m.owners[shard] = (name, state)
    return m


class _Fresh:
    """A new autocommit connection, closed at the end of the block."""

    def __init__(self, config: Config, name: str) -> None:
        self.conn = connect(name, config.dsn(name), autocommit=True)

    def __enter__(self) -> psycopg.Connection[Any]:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def fresh_connection(config: Config, name: str) -> AbstractContextManager[psycopg.Connection[Any]]:
    return _Fresh(config, name)


def read_catalogs(
    config: Config, *, connection: Connector | None = None, retry: Connector | None = None
) -> tuple[dict[str, CatalogState], dict[str, int], dict[str, str]]:
    """Every configured database's map rows and layout (in parallel; not the schema scan `pgidgen map` does):
    states, map versions, and what was unreachable. connection(name): a context manager yielding an autocommit
    connection (a router's pools); a new connection each by default. retry(name): a connection to read again
    with when the first failed (a pooled one the server or a pooler dropped)."""

    def work(name: str) -> tuple[CatalogState, int]:
        try:
            return read_one(name, connection or (lambda n: fresh_connection(config, n)))
        except DatabaseError:
            if retry is None:
                raise
            return read_one(name, retry)

    def read_one(name: str, connection: Connector) -> tuple[CatalogState, int]:
        with connection(name) as conn:
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


class MapCache:
    """The current RoutingMap of a Router. pooled(name) lends a connection of the router's pools (a re-read costs
    ~1 ms), fresh(name) opens a new one (for a database that did not answer last time: one that is down fails at
    once instead of waiting for the pool)."""

    def __init__(
        self,
        config: Config,
        *,
        pooled: Connector,
        fresh: Connector,
        listen: bool,
        max_age: float | None,
        application_name: str,
        stats: dict[str, int],
        connect_timeout: int = CONNECT_TIMEOUT,
    ) -> None:
        self.config = config
        self.connect_timeout = connect_timeout
        self.pooled = pooled
        self.fresh = fresh
        self.listen = listen
        self.max_age = max_age
        self.application_name = application_name
        self.stats = stats
        self._map: RoutingMap | None = None
        self._stale = True
        self._lock = threading.Lock()  # one map reader at a time
        self._closed = False
        self._stop = threading.Event()
        self._listeners: list[threading.Thread] = []
        self._hearing: set[str] = set()  # databases whose LISTEN connection is up
        self._age = max_age if max_age is not None or not listen else DEAF_POLL

    def _heard(self, name: str, hearing: bool) -> None:
        """A listener came up or went down: while any database cannot be heard, poll the map versions."""
        (self._hearing.add if hearing else self._hearing.discard)(name)
        self._set_age()

    def _set_age(self) -> None:
        """How old the map may get before the versions are polled: max_age; every DEAF_POLL while a database cannot
        be heard, or was unreachable at the last read (its shards come back when it does, listening or not)."""
        m = self._map
        down = m is not None and bool(m.unreachable)
        if self.max_age is not None:
            self._age = min(self.max_age, DEAF_POLL) if down else self.max_age
        else:
            deaf = self.listen and len(self._hearing) < len(self.config.databases)
            self._age = DEAF_POLL if deaf or down else None

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        for t in self._listeners:
            t.join(timeout=5)

    def invalidate(self) -> None:
        """Make the next routing call re-read the map (a listener calls this on NOTIFY pgidgen_map)."""
        self._stale = True

    def get(self) -> RoutingMap:
        """The current snapshot, re-read first if a move announced itself, a route was stale, or (max_age)
        a database's pgidgen.map_version moved. While one thread re-reads it, the others keep routing by the
        previous snapshot: the claim, not the map, is what keeps writes in the right place."""
        m = self.peek()
        if m is not None:
            return m
        m = self._map
        if not self._lock.acquire(blocking=m is None):
            return m  # type: ignore[return-value]  # m is not None here: someone else is re-reading
        try:
            if self._closed:
                raise RoutingError("this Router is closed", hint="create a new one")
            m = self._map
            age = self._age
            if m is not None and not self._stale and age is not None and time.monotonic() - m.loaded_at >= age:
                if not self._versions_moved(m):
                    m.loaded_at = time.monotonic()
                    return m
                self._stale = True
            if m is None or self._stale:
                if self.listen and not self._listeners:
                    self._start_listeners()
                self._stale = False  # before reading: a NOTIFY during the read marks it stale again
                try:
                    states, versions, unreachable = read_catalogs(self.config, connection=self._map_connection, retry=self.fresh)
                    m = build_routes(self.config, states, versions, unreachable, previous=self._map)
                except PgidgenError:
                    self._stale = True
                    raise
                self._map = m
                self._set_age()
                self.stats["map_loads"] += 1
            return m
        finally:
            self._lock.release()

    def shard_count(self) -> int:
        """The number of shards: fixed at init, so any snapshot's (no re-read, no I/O once one was read; the
        AsyncRouter's shard_for runs on the event loop)."""
        m = self._map
        return (m if m is not None else self.get()).shard_count

    def peek(self) -> RoutingMap | None:
        """The snapshot when it needs no reading first (what get() returns without I/O), else None."""
        m = self._map
        age = self._age
        if m is not None and not self._stale and (age is None or time.monotonic() - m.loaded_at < age):
            return m
        return None

    def _map_connection(self, name: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        m = self._map
        if m is not None and name in m.versions:
            return self.pooled(name)
        return self.fresh(name)

    def _versions_moved(self, m: RoutingMap) -> bool:
        """Whether any database's pgidgen.map_version differs from the snapshot's (one tiny query each, on the
        pools). The sequence moves when the map changes, before that change commits: a poll in between keeps
        the old map with the new version, and the first write there gets ShardMovedError and re-reads it."""
        for name in self.config.select(None):
            if name not in m.versions:
                return True  # unreachable at the last read: read everything again
            try:
                with self.pooled(name) as conn:
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
            ev.wait(timeout=self.connect_timeout + 1)

    def _listen_loop(self, name: str, ready: threading.Event) -> None:
        """LISTEN on the database's direct connection (admin_dsn); a transaction pooler would hand the LISTENing
        session to other clients and drop the notifications, so through one the map is polled instead."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                dsn = self.config.dsn(name)
                with psycopg.connect(
                    dsn, autocommit=True, application_name=self.application_name, **timeout_for(dsn, self.connect_timeout)
                ) as conn:
                    if self.config.poolers.get(name) != "session" and behind_pooler(conn):
                        ready.set()
                        return  # deaf for good: polled
                    conn.execute("LISTEN pgidgen_map")
                    self.invalidate()  # whatever happened while not listening
                    self._heard(name, True)
                    ready.set()
                    backoff = 0.1
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.2):
                            self.invalidate()
            except (psycopg.Error, PgidgenError):  # PgidgenError: its ${VAR} is not set (config.dsn)
                self._heard(name, False)
                ready.set()  # unreachable now: the map says so and is polled; reconnecting (above) re-reads it
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
