"""routing: a write and a read through Router.run (claim_shard + search_path with the first statement, pooled) and
Router.execute (claim, statement and commit in one round trip) vs the same SQL on a plain psycopg connection to
the right database (execute + commit; and, for reference, in autocommit), direct and through PgBouncer (transaction mode);
1 and 4 threads on one shard (the claim lock is shared by all writers); and re-reading the map after a move,
against the full catalog read of `pgidgen map`."""
from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from common import one_cpu, postmaster_pid, row, section, servers, timed, two_cpus

from pgidgen import pgbouncer, sandbox
from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout
from pgidgen.routing import Router
from pgidgen.shardmap import read_map

SHARDS = 16
BIG = int(os.environ.get("BENCH_ROUTING_SHARDS", "2000"))
N = int(os.environ.get("BENCH_ROUTING_N", "6000"))
CHUNK = 50
ROUNDS = int(os.environ.get("BENCH_RUNS", "3"))
THREADS = 4
INSERT = "INSERT INTO items (k) VALUES (%s) RETURNING id"
SELECT = "SELECT k FROM items WHERE id = %s"


def interleaved(threads: int, n: int, factories: dict[str, Callable[[], Callable[[int], Any]]]) -> dict[str, float]:
    """Microseconds per operation of each factory's operation, measured in turns of CHUNK operations (plain,
    routed, plain, ...) so that the load of a shared machine falls on all of them alike: with one thread the
    median latency of all of its operations, and (key + ' cpu') the median over turns of this process's CPU time
    per operation (user and system: what the client itself spends, which the server's scheduling does not
    change), and (key + ' mean') the median over turns of a turn's mean latency; with several threads, the median
    over turns of wall time / operations."""
    ops = {k: [f() for _ in range(threads)] for k, f in factories.items()}
    samples: dict[str, list[float]] = {k: [] for k in factories}
    cpu: dict[str, list[float]] = {k: [] for k in factories}
    for _ in range(max(1, n // CHUNK)):
        for k in factories:
            c0 = time.process_time()
            samples[k].extend(_turn(threads, ops[k]))
            cpu[k].append((time.process_time() - c0) / CHUNK)
    out = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    if threads == 1:
        out.update({f"{k} cpu": statistics.median(v) * 1e6 for k, v in cpu.items()})
        # the median over turns of each turn's mean: the slow operations count too (plain psycopg's three round
        # trips have the longer tail)
        out.update({f"{k} mean": statistics.median(statistics.mean(v[i:i + CHUNK]) for i in range(0, len(v), CHUNK)) * 1e6
                    for k, v in samples.items()})
    return out


def _turn(threads: int, ops: list[Callable[[int], Any]]) -> list[float]:
    if threads == 1:
        op, out = ops[0], []
        for i in range(CHUNK):
            t0 = time.perf_counter()
            op(i)
            out.append(time.perf_counter() - t0)
        return out
    barrier = threading.Barrier(threads + 1)

    def worker(op: Callable[[int], Any]) -> None:
        barrier.wait()
        for i in range(CHUNK):
            op(i)

    ts = [threading.Thread(target=worker, args=(op,)) for op in ops]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return [(time.perf_counter() - t0) / (threads * CHUNK)]


def compare(label: str, config: Config, plain_dsn: str, some_id: int, **plain_kwargs: Any) -> None:
    """Router.run (claim with the first statement, pooled) against plain psycopg (a connection per thread, the
    table schema-qualified, execute + commit) on the same statement."""

    def plain(sql_text: str, arg: Callable[[int], int], autocommit: bool = False) -> Callable[[], Callable[[int], Any]]:
        def factory() -> Callable[[int], Any]:
            conn = psycopg.connect(plain_dsn, autocommit=autocommit, **plain_kwargs)
            if autocommit:
                return lambda i: conn.execute(sql_text, (arg(i),)).fetchone()
            return lambda i: (conn.execute(sql_text, (arg(i),)).fetchone(), conn.commit())

        return factory

    plain_writer = plain(INSERT.replace("items", "shard_5.items"), lambda i: i)
    plain_reader = plain(SELECT.replace("items", "shard_5.items"), lambda i: some_id)
    auto_writer = plain(INSERT.replace("items", "shard_5.items"), lambda i: i, autocommit=True)
    auto_reader = plain(SELECT.replace("items", "shard_5.items"), lambda i: some_id, autocommit=True)
    with Router(config, min_size=THREADS, max_size=THREADS) as router:
        router.run(5, lambda c: None)  # warm: map loaded, pool open

        def routed_writer() -> Callable[[int], Any]:
            return lambda i: router.run(5, lambda c: c.execute(INSERT, (i,)).fetchone())

        def routed_reader() -> Callable[[int], Any]:
            return lambda i: router.run(5, lambda c: c.execute(SELECT, (some_id,)).fetchone(), read_only=True)

        def executed_writer() -> Callable[[int], Any]:
            return lambda i: router.execute(5, INSERT, (i,))[0]

        def executed_reader() -> Callable[[int], Any]:
            return lambda i: router.execute(5, SELECT, (some_id,), read_only=True)[0]

        section(f"{label}: one INSERT ... RETURNING id or one SELECT by id per transaction, shard 5: 1 thread median latency,"
                f" {THREADS} threads median wall/op of turns (us; {N} operations each, in turns of {CHUNK} interleaved)")
        for threads in (1, THREADS):
            m = interleaved(threads, N, {"bw": plain_writer, "rw": routed_writer, "ew": executed_writer, "aw": auto_writer,
                                         "br": plain_reader, "rr": routed_reader, "er": executed_reader, "ar": auto_reader})
            row(f"{threads} thread(s): plain psycopg write", m["bw"], "us")
            row(f"{threads} thread(s): Router.run write", m["rw"], "us", m["bw"], "of plain")
            row(f"{threads} thread(s): Router.execute write", m["ew"], "us", m["bw"], "of plain")
            row(f"{threads} thread(s): plain psycopg read", m["br"], "us")
            row(f"{threads} thread(s): Router.run read_only", m["rr"], "us", m["br"], "of plain")
            row(f"{threads} thread(s): Router.execute read_only", m["er"], "us", m["br"], "of plain")
            # for reference: psycopg in autocommit, the statement alone (no transaction block, nothing claimed)
            row(f"{threads} thread(s): plain psycopg autocommit write", m["aw"], "us")
            row(f"{threads} thread(s): Router.execute write", m["ew"], "us", m["aw"], "of autocommit")
            row(f"{threads} thread(s): plain psycopg autocommit read", m["ar"], "us")
            row(f"{threads} thread(s): Router.execute read_only", m["er"], "us", m["ar"], "of autocommit")
            if threads == 1:
                row("1 thread: mean of a turn, plain write", m["bw mean"], "us")
                row("1 thread: mean of a turn, Router.run write", m["rw mean"], "us", m["bw mean"], "of plain")
                row("1 thread: mean of a turn, plain read", m["br mean"], "us")
                row("1 thread: mean of a turn, Router.run read_only", m["rr mean"], "us", m["br mean"], "of plain")
                row("1 thread: mean of a turn, Router.execute write", m["ew mean"], "us", m["bw mean"], "of plain")
                row("1 thread: mean of a turn, Router.execute read_only", m["er mean"], "us", m["br mean"], "of plain")
                row("1 thread: client CPU, plain write", m["bw cpu"], "us")
                row("1 thread: client CPU, Router.run write", m["rw cpu"], "us", m["bw cpu"], "of plain")
                row("1 thread: client CPU, plain read", m["br cpu"], "us")
                row("1 thread: client CPU, Router.run read_only", m["rr cpu"], "us", m["br cpu"], "of plain")
        if label.startswith("direct, client on CPU") or label.startswith("direct, placed"):

            def routed_locate() -> Callable[[int], Any]:
                return lambda i: router.database_for(router.shard_for(i))

            row("shard_for + database_for (cached map)", interleaved(1, N, {"l": routed_locate})["l"], "us")


def _apart(label: str, cpus: tuple[int, int] | None, server: str = "server") -> str:
    if cpus is None:
        return f"{label}, placed by the scheduler"
    return f"{label}, client on CPU {cpus[0]}, {server} on CPU {cpus[1]}"


def run() -> None:
    with servers(1) as srv:
        config = Config(layout=Layout.make(), databases={"db1": srv[0].dsn})
        assert all(o.ok for o in init(config, SHARDS, ["db1"]))
        with psycopg.connect(srv[0].dsn, autocommit=True) as conn:
            conn.execute("SET search_path = shard_5")
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY DEFAULT next_id(), k bigint NOT NULL)")
            some_id = conn.execute(INSERT, (0,)).fetchone()[0]  # type: ignore[index]
        pm = postmaster_pid(srv[0])
        with one_cpu([pm]) as cpu:
            compare(f"direct, client and server on CPU {cpu}", config, srv[0].dsn, some_id)
        with two_cpus([pm]) as cpus:
            compare(_apart("direct", cpus), config, srv[0].dsn, some_id)
        if pgbouncer.find() is None:
            section("through PgBouncer: skipped, pgbouncer is not installed (make deps installs it)")
        else:
            root = sandbox.make_root()
            bouncer = pgbouncer.start(root, {"db1": srv[0].dsn}, mode="transaction")
            try:
                pooled = Config(layout=config.layout, databases={"db1": srv[0].dsn}, app_dsns={"db1": bouncer.dsn("db1")})
                # plain psycopg behind a transaction pooler must not prepare statements either
                with one_cpu([pm, bouncer.proc.pid]) as cpu:
                    compare(f"through PgBouncer (transaction mode), client, pgbouncer and server on CPU {cpu}", pooled, bouncer.dsn("db1"), some_id,
                            prepare_threshold=None)
                with two_cpus([pm, bouncer.proc.pid]) as cpus:
                    compare(_apart("through PgBouncer (transaction mode)", cpus, "pgbouncer and server"), pooled, bouncer.dsn("db1"), some_id,
                            prepare_threshold=None)
            finally:
                bouncer.stop()
                shutil.rmtree(root, ignore_errors=True)

        section(f"re-reading the map after a move: {BIG} shards on one database, median of {ROUNDS * 3} (ms)")
        big = Config(layout=Layout.make(), databases={"db1": srv[0].dsn.rsplit("/", 1)[0] + "/big"})
        with psycopg.connect(srv[0].dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE big")
        assert all(o.ok for o in init(big, BIG, ["db1"]))
        with Router(big, listen=False) as router:
            router.routing_map()

            def reread() -> None:
                router.invalidate()
                router.routing_map()

            full = statistics.median(timed(lambda: read_map(big)) for _ in range(ROUNDS * 3)) * 1000
            rows = statistics.median(timed(reread) for _ in range(ROUNDS * 3)) * 1000
            row("pgidgen map's read (new connection, schema scan)", full, "ms")
            row("Router re-read (pooled, map rows only)", rows, "ms", full, "of pgidgen map's read")
