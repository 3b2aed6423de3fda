"""Helpers shared by the move tests and the move bench: a continuous writer that follows the shard map, and a
check that no replication object is left behind."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")
R = TypeVar("R")


def writes_around(write: Callable[[int], T], between: Callable[[], R], *, before: int = 50, after: int = 50,
                  finish: Callable[[], object] | None = None) -> tuple[list[T], list[BaseException], R]:
    """write(n), n = 0, 1, ..., in a loop in a thread, as an application would: `before` acknowledged writes, then
    between() (a move) on the calling thread, then `after` more. The writes acknowledged, every exception the loop
    saw (what would reach the application), and between()'s result; finish() runs in the thread at its end."""
    ids: list[T] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop() -> None:
        n = 0
        while not stop.is_set():
            try:
                ids.append(write(n))
            except BaseException as e:  # noqa: BLE001 - every exception the application would see
                errors.append(e)
            n += 1
        if finish is not None:
            finish()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        while len(ids) < before and th.is_alive():
            time.sleep(0.01)
        result = between()
        n_at = len(ids)
        while len(ids) < n_at + after and th.is_alive():
            time.sleep(0.01)
    finally:
        stop.set()
        th.join(30)
    return ids, errors, result


class Writer(threading.Thread):
    """Inserts into shard_N.t as fast as it can, routed by pgidgen.shards like an application would be:
    on any error it re-reads the map from every database and writes where the shard is active (or moving).
    Records every acknowledged ID in order, and the longest gap between two acknowledged writes."""

    def __init__(self, dsns: dict[str, str], shard: int, table: str = "t", *, delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.dsns = dsns
        self.shard = shard
        self.table = table
        self.delay = delay
        self.ids: list[int] = []
        self.errors: list[str] = []
        self.max_gap = 0.0
        self.gaps: list[float] = []  # between two acknowledged writes, in order
        self.stop_flag = threading.Event()
        self.conns: dict[str, psycopg.Connection[Any]] = {}

    def conn(self, name: str) -> psycopg.Connection[Any]:
        c = self.conns.get(name)
        if c is None or c.closed:
            c = self.conns[name] = psycopg.connect(self.dsns[name], autocommit=True)
        return c

    def route(self) -> str | None:
        for name in self.dsns:
            try:
                row = self.conn(name).execute("SELECT state FROM pgidgen.shards WHERE shard = %s", (self.shard,)).fetchone()
            except psycopg.Error:
                continue
            if row and row[0] in ("active", "moving"):
                return name
        return None

    def run(self) -> None:
        where = self.route()
        last = time.perf_counter()
        n = 0
        while not self.stop_flag.is_set():
            if where is None:
                time.sleep(0.001)
                where = self.route()
                continue
            try:
                row = self.conn(where).execute(
                    f"INSERT INTO shard_{self.shard}.{self.table} (v) VALUES (%s) RETURNING id", (n,)
                ).fetchone()
            except psycopg.Error as e:
                self.errors.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0]}")
                where = self.route()
                continue
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            self.gaps.append(now - last)
            last = now
            assert row is not None
            self.ids.append(int(row[0]))
            n += 1
            if self.delay:
                time.sleep(self.delay)
        for c in self.conns.values():
            c.close()

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)


def leftovers(dsns: dict[str, str]) -> list[str]:
    """Replication objects of these databases: slots, publications, subscriptions (should be none after a move)."""
    found: list[str] = []
    for name, dsn in dsns.items():
        with psycopg.connect(dsn, autocommit=True) as c:
            found += [f"{name}: slot {r[0]}" for r in c.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")]
            found += [f"{name}: publication {r[0]}" for r in c.execute("SELECT pubname FROM pg_publication")]
            found += [f"{name}: subscription {r[0]}" for r in c.execute(
                "SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())")]
    return found
