"""Connection policy and pools: one psycopg_pool per database on its app_dsn, lent out as autocommit
connections (the unit of work opens and ends each transaction itself).

The policy is chosen per database, so a user need not know what sits in between. `pooler = ...` in the config
says it; otherwise one probe tells: a pooler such as PgBouncer gives the client a backend key of its own, so the
pid libpq was told differs from the server's pg_backend_pid(). Through a transaction pooler (or an unknown
pooler: the safe side) each transaction may run on another server connection, so the Router keeps no session
state (search_path and read-only are set per transaction already) and psycopg prepares no statements on the
server, unless the config says the pooler keeps them per client (prepared_statements = true).

Every connect of the Router's goes through its breaker (breaker.py): a database that cannot be connected to fails
its calls at once, and its pool is dropped, to be made anew when a connect works again."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ..config import Config, describe_dsn
from ..db import pg_message, timeout_for
from ..errors import DatabaseError, DatabaseUnavailableError, RoutingError
from .breaker import CONNECT_TIMEOUT, Breaker, no_answer
from .claiming import ClaimingConnection, has_claim_call

IDLE = TransactionStatus.IDLE


@dataclass(frozen=True)
class Policy:
    """How the router talks to one database: pooler is 'transaction', 'session' or 'none'."""

    pooler: str
    prepare: bool
    #: connect_timeout (the Router's), unless the app's DSN (or PGCONNECT_TIMEOUT) sets its own (db.timeout_for)
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


def policy_for(config: Config, name: str, application_name: str, *, connect_timeout: int = CONNECT_TIMEOUT) -> Policy:
    """The policy for a database; one that cannot be probed now gets the safe settings (its pool reports it)."""
    try:
        return probe_policy(config, name, application_name, connect_timeout=connect_timeout)
    except psycopg.Error:
        return safe_policy(config, name, connect_timeout=connect_timeout)


def safe_policy(config: Config, name: str, *, connect_timeout: int) -> Policy:
    """A transaction pooler's settings (the strictest), for a database that could not be asked."""
    timeout = timeout_for(config.app_dsn(name), connect_timeout)
    return Policy(pooler="transaction", prepare=name in config.pooler_prepares, timeout=tuple(timeout.items()))


def probe_policy(config: Config, name: str, application_name: str, *, connect_timeout: int) -> Policy:
    """policy_for, raising psycopg.Error when the database has to be asked and cannot be connected to."""
    pooler = config.poolers.get(name)
    dsn = config.app_dsn(name)
    timeout = timeout_for(dsn, connect_timeout)
    if pooler is None:
        with psycopg.connect(dsn, autocommit=True, application_name=application_name, **timeout) as conn:
            pooler = "transaction" if behind_pooler(conn) else "none"  # its mode unknown: assume the strictest
    prepare = pooler != "transaction" or name in config.pooler_prepares
    return Policy(pooler=pooler, prepare=prepare, timeout=tuple(timeout.items()))


def _waiting(pool: ConnectionPool[Any]) -> bool:
    """Whether a client waits in pool.getconn (psycopg_pool's queue of them; its stats, when that is not there)."""
    queue = getattr(pool, "_waiting", None)
    return bool(queue) if queue is not None else bool(pool.get_stats().get("requests_waiting"))


class _Pool(ConnectionPool[ClaimingConnection]):
    """psycopg_pool's pool, telling the breaker when a connect of its own (in its workers) got no answer: a client
    waiting for a connection from it would otherwise wait out the pool's timeout."""

    def __init__(self, *args: Any, lost: Callable[[_Pool, BaseException], None], **kwargs: Any) -> None:
        self.lost = lost
        super().__init__(*args, **kwargs)

    def _connect(self, timeout: float | None = None) -> ClaimingConnection:
        try:
            return super()._connect(timeout)
        except psycopg.OperationalError as e:
            if no_answer(e):
                self.lost(self, e)
            raise


class Pools:
    """The router's pools, opened on first use of each database, and the breaker of its connects."""

    def __init__(
        self,
        config: Config,
        *,
        min_size: int,
        max_size: int,
        timeout: float,
        application_name: str,
        connect_timeout: int,
        probe_every: float,
        stats: dict[str, int],
    ) -> None:
        self.config = config
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.policies: dict[str, Policy] = {}
        self.breaker = Breaker(reach=self._reach, describe=self.describe, probe_every=probe_every, stats=stats)
        self.breaker.on_trip(self._reset)
        self.down = self.breaker.down  # the breaker's: `name in down` is the check every unit makes
        self._lock = threading.Lock()
        self._pools: dict[str, _Pool] = {}
        self._idle: dict[str, list[ClaimingConnection]] = {name: [] for name in config.databases}
        self._closing: list[threading.Thread] = []
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._release_idle()
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()
        for t in self._closing:
            t.join(timeout=self.connect_timeout + 5)

    def describe(self, name: str) -> str:
        return describe_dsn(self.config.app_dsn(name))

    def policy(self, name: str) -> Policy:
        """How to talk to the database (asked of it once, on first use); DatabaseUnavailableError if it has to be
        asked and does not answer (asked again next time). A server that answers the probe with a refusal (a
        password, too many clients) gets the safe settings, as before: its pool reports that it has no connection."""
        p = self.policies.get(name)
        if p is None:
            if name in self.down:
                self.breaker.let_through(name)  # its probe asks the policy
                p = self.policies.get(name)
            if p is None:
                try:
                    p = probe_policy(self.config, name, self.application_name, connect_timeout=self.connect_timeout)
                except psycopg.Error as e:
                    if no_answer(e):
                        raise self.breaker.trip(name, e) from None
                    p = safe_policy(self.config, name, connect_timeout=self.connect_timeout)
                self.policies[name] = p
        return p

    def _reach(self, name: str) -> None:
        """The breaker's probe: one connect with the pool's settings (the policy's probe, if it was never asked)."""
        p = self.policies.get(name)
        if p is None:
            self.policies[name] = probe_policy(self.config, name, self.application_name, connect_timeout=self.connect_timeout)
            return
        psycopg.connect(self.config.app_dsn(name), **p.connect_kwargs(self.application_name)).close()

    def lost(self, name: str, e: BaseException | None = None) -> DatabaseUnavailableError | None:
        """A connection to name broke (e: or failed): the breaker's error if the database does not answer now."""
        return self.breaker.lost(name, e)

    def _reset(self, name: str) -> None:
        """The database went down: drop its pool and the connections kept idle (all broken, or soon), so the calls
        after it is back get new ones at once, not after the old pool's reconnection backoff. Lent ones go back to
        the old pool as they return (give_back), which closes them."""
        with self._lock:
            pool = self._pools.pop(name, None)
            idle, self._idle[name] = self._idle[name], []
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                break
            conn.close()
        if pool is not None:
            closing = threading.Thread(target=pool.close, kwargs={"timeout": self.connect_timeout + 1.0},
                                       name=f"pgidgen-close-{name}", daemon=True)
            closing.start()
            self._closing = [t for t in self._closing if t.is_alive()] + [closing]

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
        statements prepared), else one from psycopg_pool (which hands them out in turn). A database that is down
        fails at once (the breaker), but for a call now and then that tries it again."""
        if name in self.down:
            self.breaker.let_through(name)
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
                return pool.getconn(timeout=max(0.001, min(0.05, deadline - time.monotonic())))
            except PoolTimeout:
                if name in self.down:  # its connect got no answer meanwhile: no connection is coming
                    raise self.breaker.error(name) from None
                if time.monotonic() >= deadline:
                    raise self._timeout(name) from None
            except PoolClosed:  # dropped meanwhile: the database went down, or the router closed
                if name in self.down:
                    raise self.breaker.error(name) from None
                pool = self._pools.get(name) or self._open(name)

    def give_back(self, name: str, conn: ClaimingConnection) -> None:
        pool = self._pools.get(name)
        if pool is None or conn._pool is not pool:  # the router closed, or the database went down, meanwhile
            owner = conn._pool
            if isinstance(owner, ConnectionPool):
                owner.putconn(conn)  # a closed pool closes it
            else:
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
        """A new connection with the pool's settings, closed at the end (for a database that did not answer);
        through the breaker, as the pool's."""
        if name in self.down:
            self.breaker.let_through(name)
        dsn = self.config.app_dsn(name)
        try:
            conn = psycopg.connect(dsn, **self.policy(name).connect_kwargs(self.application_name))
        except psycopg.Error as e:
            if no_answer(e):
                raise self.breaker.trip(name, e) from None
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

    def _open(self, name: str) -> _Pool:
        policy = self.policy(name)  # before the lock: it may connect
        with self._lock:
            if self._closed:
                raise RoutingError("this Router is closed", hint="create a new one")
            if name in self.down:  # went down since this call checked: no pool until a probe finds it back
                raise self.breaker.error(name)
            pool = self._pools.get(name)
            if pool is None:
                pool = _Pool(
                    self.config.app_dsn(name),
                    min_size=self.min_size,
                    max_size=self.max_size,
                    kwargs=policy.connect_kwargs(self.application_name),
                    name=f"pgidgen-{name}",
                    connection_class=ClaimingConnection,
                    configure=has_claim_call,
                    open=False,
                    lost=partial(self._pool_lost, name),
                )
                self._pools[name] = pool
                pool.open()
        return pool

    def _pool_lost(self, name: str, pool: _Pool, e: BaseException) -> None:
        """A connect in the current pool's worker got no answer (one of a pool already dropped: nothing new)."""
        if self._pools.get(name) is pool:
            self.breaker.trip(name, e)


__all__ = ["Policy", "Pools", "behind_pooler", "policy_for", "probe_policy", "safe_policy"]
