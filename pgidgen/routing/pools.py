"""Connection policy and pools: one psycopg_pool per database on its app_dsn, lent out as autocommit
connections (the unit of work opens and ends each transaction itself).

The policy is chosen per database, so a user need not know what sits in between. `pooler = ...` in the config
says it; otherwise one probe tells: a pooler such as PgBouncer gives the client a backend key of its own, so the
pid libpq was told differs from the server's pg_backend_pid(). Through a transaction pooler (or an unknown
pooler: the safe side) each transaction may run on another server connection, so the Router keeps no session
state (search_path and read-only are set per transaction already) and psycopg prepares no statements on the
server, unless the config says the pooler keeps them per client (prepared_statements = true)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from ..config import Config, describe_dsn
from ..db import CONNECT_TIMEOUT, pg_message, timeout_for
from ..errors import DatabaseError, RoutingError
from .claiming import ClaimingConnection, has_claim_call

IDLE = TransactionStatus.IDLE


@dataclass(frozen=True)
class Policy:
    """How the router talks to one database: pooler is 'transaction', 'session' or 'none'."""

    pooler: str
    prepare: bool
    #: connect_timeout, unless the app's DSN (or PGCONNECT_TIMEOUT) sets its own (db.timeout_for)
    timeout: tuple[tuple[str, Any], ...] = (("connect_timeout", CONNECT_TIMEOUT),)

    def connect_kwargs(self, application_name: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": application_name, **dict(self.timeout)}
        if not self.prepare:
            kwargs["prepare_threshold"] = None
        return kwargs


def behind_pooler(conn: psycopg.Connection[Any]) -> bool:
    """Whether conn reaches its server through a pooler: the backend pid libpq was given is not the server's."""
    row = conn.execute("SELECT pg_catalog.pg_backend_pid()", prepare=False).fetchone()
    return row is None or int(row[0]) != conn.info.backend_pid


def policy_for(config: Config, name: str, application_name: str) -> Policy:
    pooler = config.poolers.get(name)
    dsn = config.app_dsn(name)
    timeout = timeout_for(dsn)
    if pooler is None:
        try:
            with psycopg.connect(dsn, autocommit=True, application_name=application_name, **timeout) as conn:
                pooler = "transaction" if behind_pooler(conn) else "none"  # its mode unknown: assume the strictest
        except psycopg.Error:
            pooler = "transaction"  # unreachable now: the pool reports it; safe settings meanwhile
    prepare = pooler != "transaction" or name in config.pooler_prepares
    return Policy(pooler=pooler, prepare=prepare, timeout=tuple(timeout.items()))


def _waiting(pool: ConnectionPool) -> bool:
    """Whether a client waits in pool.getconn (psycopg_pool's queue of them; its stats, when that is not there)."""
    queue = getattr(pool, "_waiting", None)
    return bool(queue) if queue is not None else bool(pool.get_stats().get("requests_waiting"))


class Pools:
    """The router's pools, opened on first use of each database."""

    def __init__(self, config: Config, *, min_size: int, max_size: int, timeout: float, application_name: str) -> None:
        self.config = config
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self.application_name = application_name
        self.policies: dict[str, Policy] = {}
        self._lock = threading.Lock()
        self._pools: dict[str, ConnectionPool] = {}
        self._idle: dict[str, list[ClaimingConnection]] = {name: [] for name in config.databases}
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._release_idle()
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()

    def policy(self, name: str) -> Policy:
        p = self.policies.get(name)
        if p is None:
            p = self.policies[name] = policy_for(self.config, name, self.application_name)
        return p

    @contextmanager
    def connection(self, name: str) -> Iterator[ClaimingConnection]:
        """A pooled autocommit connection (borrow, then give_back)."""
        conn = self.borrow(name)
        try:
            yield conn
        finally:
            self.give_back(name, conn)

    def borrow(self, name: str) -> ClaimingConnection:
        """The connection this database's last unit of work gave back, if idle (its server process warm, its
        statements prepared), else one from psycopg_pool (which hands them out in turn)."""
        idle = self._idle[name]
        if idle:
            try:
                return idle.pop()
            except IndexError:  # another thread took it meanwhile
                pass
        pool = self._pools.get(name) or self._open(name)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._idle[name].pop()
            except IndexError:
                pass
            try:  # a short wait, then the idle list again: one may have come back there meanwhile
                return pool.getconn(timeout=max(0.001, min(0.05, deadline - time.monotonic())))  # type: ignore[return-value]
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise self._timeout(name) from None

    def give_back(self, name: str, conn: ClaimingConnection) -> None:
        pool = self._pools.get(name)
        if pool is None:  # the router closed meanwhile
            conn.close()
            return
        if not self._closed and not conn.closed and conn.pgconn.transaction_status == IDLE and not _waiting(pool):
            self._idle[name].append(conn)
        else:
            pool.putconn(conn)
        if self._closed:
            self._release_idle()

    def _release_idle(self) -> None:
        for name, idle in list(self._idle.items()):
            pool = self._pools.get(name)
            while idle:
                conn = idle.pop()
                if pool is not None:
                    pool.putconn(conn)
                else:
                    conn.close()

    @contextmanager
    def fresh(self, name: str) -> Iterator[psycopg.Connection[Any]]:
        """A new connection with the pool's settings, closed at the end (for a database that did not answer)."""
        dsn = self.config.app_dsn(name)
        try:
            conn = psycopg.connect(dsn, **self.policy(name).connect_kwargs(self.application_name))
        except psycopg.Error as e:
            raise DatabaseError(
                f"cannot connect to database {name} ({describe_dsn(dsn)}): {pg_message(e)}",
                hint="check that the server is running and the connection string in the config is right",
            ) from None
        with conn:
            yield conn

    def _timeout(self, name: str) -> DatabaseError:
        return DatabaseError(
            f"no connection to database {name} ({describe_dsn(self.config.app_dsn(name))}) within {self.timeout:g}s",
            hint="check that the server is running and accepts connections, or raise max_size",
        )

    def _open(self, name: str) -> ConnectionPool:
        policy = self.policy(name)  # before the lock: it may connect
        with self._lock:
            if self._closed:
                raise RoutingError("this Router is closed", hint="create a new one")
            pool = self._pools.get(name)
            if pool is None:
                pool = ConnectionPool(
                    self.config.app_dsn(name),
                    min_size=self.min_size,
                    max_size=self.max_size,
                    kwargs=policy.connect_kwargs(self.application_name),
                    name=f"pgidgen-{name}",
                    connection_class=ClaimingConnection,
                    configure=has_claim_call,
                    open=True,
                )
                self._pools[name] = pool
        return pool


__all__ = ["Policy", "Pools", "behind_pooler", "policy_for"]
