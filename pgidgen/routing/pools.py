"""Connection policy and pools: one psycopg_pool per database, lent out as autocommit connections; the unit of
work (unit.py) opens and ends each transaction itself."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..config import Config, describe_dsn
from ..db import CONNECT_TIMEOUT
from ..errors import DatabaseError, RoutingError


class Pools:
    """The router's pools, opened on first use of each database."""

    def __init__(self, config: Config, *, min_size: int, max_size: int, timeout: float, application_name: str) -> None:
        self.config = config
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self.application_name = application_name
        self._lock = threading.Lock()
        self._pools: dict[str, ConnectionPool] = {}
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()

    @contextmanager
    def connection(self, name: str) -> Iterator[psycopg.Connection[Any]]:
        pool = self._pools.get(name) or self._open(name)
        try:
            with pool.connection(timeout=self.timeout) as conn:
                yield conn
        except PoolTimeout:
            raise DatabaseError(
                f"no connection to database {name} ({describe_dsn(self.config.dsn(name))}) within {self.timeout:g}s",
                hint="check that the server is running and accepts connections, or raise max_size",
            ) from None

    def _open(self, name: str) -> ConnectionPool:
        with self._lock:
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
