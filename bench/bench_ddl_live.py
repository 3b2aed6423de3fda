"""apply-ddl on live shards: an application's query latency while ALTER TABLE ... ADD COLUMN meets a long transaction.

One session holds a transaction open (PGIDGEN_BENCH_HOLD seconds, default 5; the issue's case is 30) after reading
the table of the last shard of db1, so apply-ddl's transaction on db1 has locked every other shard of db1 when it
meets the blocker. Meanwhile an application (two threads, reads and inserts on random shards of both databases
through plain psycopg) times every query. Printed: its p99 and max during the apply against the lock timeout plus
50 ms (issue 32's target), against the same application with no apply running, and against a plain ALTER without a
lock timeout; and that the apply completes once the transaction ends. PGIDGEN_BENCH_LIVE_SHARDS (default 200; the
issue's case is 2000) shards over two databases.
"""
from __future__ import annotations

import os
import random
import statistics
import threading
import time

import psycopg
from common import row, section, servers, summed, table

from pgidgen.config import Config
from pgidgen.ddl import parse_file
from pgidgen.ddl.apply import apply_ddl
from pgidgen.init import init, spread
from pgidgen.layout import Layout
from pgidgen.lockwait import LockPolicy

SHARDS = int(os.environ.get("PGIDGEN_BENCH_LIVE_SHARDS", "200"))
HOLD = float(os.environ.get("PGIDGEN_BENCH_HOLD", "5"))
LOCK_TIMEOUT = 0.2
THREADS = 2
SEED = 200


class App:
    """THREADS threads of reads and inserts on random shards; every query's (start, seconds)."""

    def __init__(self, config: Config, where: dict[int, str]) -> None:
        self.config, self.where = config, where
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, str, int]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,)) for i in range(THREADS)]

    def __enter__(self) -> App:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def loop(self, seed: int) -> None:
        rnd = random.Random(seed)
        conns = {name: psycopg.connect(dsn, autocommit=True, application_name="app") for name, dsn in self.config.databases.items()}
        mine = []
        try:
            while not self.stop.is_set():
                shard = rnd.randrange(SHARDS)
                conn = conns[self.where[shard]]
                t0 = time.monotonic()
                if rnd.random() < 0.5:
                    conn.execute(f"SELECT count(*) FROM shard_{shard}.t").fetchone()
                else:
                    conn.execute(f"INSERT INTO shard_{shard}.t (v) VALUES (1)")
                mine.append((t0, time.monotonic() - t0, self.where[shard], shard))
                time.sleep(0.002)
        finally:
            for c in conns.values():
                c.close()
            with self.lock:
                self.samples.extend(mine)

    def between(self, start: float, end: float, database: str | None = None) -> list[float]:
        return sorted(s for t0, s, db, _ in self.samples if start <= t0 <= end and database in (None, db))

    def slowest(self, start: float, end: float, n: int = 3) -> str:
        """The n slowest queries: their shard, database, start (s after `start`) and ms."""
        top = sorted((x for x in self.samples if start <= x[0] <= end), key=lambda x: -x[1])[:n]
        return "; ".join(f"shard {sh} on {db} at {t0 - start:.1f} s: {d * 1000:.0f} ms" for t0, d, db, sh in top)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) >= 2 else (values[0] if values else 0.0)


class Ended(threading.Event):
    at = 0.0


def blocker(config: Config, shard: int) -> tuple[psycopg.Connection[tuple[int]], Ended]:
    """A report's transaction open on shard's table for HOLD seconds; the event is set (and stamped) when it ended."""
    conn = psycopg.connect(config.databases["db1"], application_name="monthly report")
    conn.execute(f"SELECT count(*) FROM shard_{shard}.t")
    ended = Ended()

    def end() -> None:
        conn.rollback()
        ended.at = time.monotonic()
        ended.set()

    threading.Timer(HOLD, end).start()
    return conn, ended


def added(config: Config, column: str) -> int:
    return summed(config.databases.values(), "SELECT count(*) FROM pg_attribute WHERE attname = %s AND NOT attisdropped"
                  " AND attrelid::regclass::text LIKE 'shard_%%.t'", (column,))


def autovacuum_runs(config: Config) -> int:
    """Autovacuum's vacuums and analyzes of the shards' tables so far, over every database."""
    return summed(config.databases.values(),
                  "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables WHERE schemaname LIKE 'shard%%'")


def live_apply(config: Config, where: dict[int, str], blocked: int, column: str, commit_every: int | None, atomic: bool = False) -> None:
    waits: list[float] = []
    autovacuum = autovacuum_runs(config)
    conn, ended = blocker(config, blocked)
    with App(config, where) as app:
        t0 = time.monotonic()
        apply_ddl(config, parse_file(f"ALTER TABLE t ADD COLUMN {column} text;\n", f"{column}.sql"), commit_every=commit_every, atomic=atomic,
                  lock_policy=LockPolicy(lock_timeout=LOCK_TIMEOUT, wait=HOLD + 120),
                  on_lock_wait=lambda name, shards, holders, waited: waits.append(time.monotonic()))
        t1 = time.monotonic()
        ended.wait()
    conn.close()
    during = app.between(t0, t1)
    how = "--atomic" if atomic else "the default: 50 ms transactions" if commit_every is None else f"--commit-every {commit_every}"
    table([("apply-ddl " + how, f"{t1 - t0:.1f} s, {len(waits)} lock waits reported, {len(during)} app queries meanwhile"),
           ("completed once the transaction ended", f"{'yes' if t1 >= ended.at else 'NO (before it)'}, {t1 - ended.at:.2f} s after it;"
            f" column on {added(config, column)} of {SHARDS} shards")])
    table([("the slowest queries", app.slowest(t0, t1)),
           ("lock waits at (s)", ", ".join(f"{w - t0:.1f}" for w in waits[:12])),
           ("autovacuum runs on shard tables meanwhile", str(autovacuum_runs(config) - autovacuum))])
    if atomic:
        table([("note", "all or nothing across databases until the first lock wait: then db2, done, commits, and db1 goes on"
                         " in chunks of 50; db1's first try holds the shards it altered before the blocked one")])
    target = (LOCK_TIMEOUT + 0.05) * 1000
    for db in (None, *config.databases):
        some = app.between(t0, t1, db)
        on = f" on {db}" if db else ""
        row(f"app p99{on} during the apply ({how})", p99(some) * 1000, "ms", target, "lock timeout + 50 ms")
        row(f"app max{on} during the apply ({how})", (some[-1] if some else 0) * 1000, "ms", target, "lock timeout + 50 ms")


def run() -> None:
    with servers(2) as started:
        config = Config(layout=Layout.make(), databases={s.name: s.dsn for s in started})
        init(config, SHARDS)
        where = {s: name for name, shards in spread(SHARDS, list(config.databases)).items() for s in shards}
        apply_ddl(config, parse_file("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id(), v int);\n", "t.sql"))
        for name, dsn in config.databases.items():  # ids 1..SEED: below any next_id()
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("".join(f"INSERT INTO shard_{s}.t (id, v) SELECT g, g FROM generate_series(1, {SEED}) g;"
                                  for s, n in where.items() if n == name).encode())
                c.execute(b"VACUUM ANALYZE")
        blocked = max(s for s, name in where.items() if name == "db1")
        section(f"ALTER TABLE ADD COLUMN on {SHARDS} shards over 2 databases; shard_{blocked}'s table read by a transaction open {HOLD:.0f} s;"
                f" lock timeout {LOCK_TIMEOUT * 1000:.0f} ms")
        with App(config, where) as app:
            t0 = time.monotonic()
            time.sleep(2)
        quiet = app.between(t0, time.monotonic())
        row("app p99, no apply running", p99(quiet) * 1000, "ms")
        row("app max, no apply running", quiet[-1] * 1000, "ms")
        live_apply(config, where, blocked, "note", None)
        live_apply(config, where, blocked, "note2", 50)
        live_apply(config, where, blocked, "note3", None, atomic=True)

        conn, ended = blocker(config, blocked)  # what the issue measured: a plain ALTER queues the application
        with App(config, where) as app, psycopg.connect(config.databases["db1"], autocommit=True) as ddl:
            t0 = time.monotonic()
            ddl.execute(f"ALTER TABLE shard_{blocked}.t ADD COLUMN plain text")
            t1 = time.monotonic()
        conn.close()
        during = app.between(t0, t1)
        row("app max during a plain ALTER of that one shard", (during[-1] if during else 0) * 1000, "ms",
            (LOCK_TIMEOUT + 0.05) * 1000, "lock timeout + 50 ms")
