"""fanout: Router.fan_out across 2000 shards on two databases vs a loop of Router.run and a hand-written UNION ALL.

The 50 newest rows and a count across 2000 shards on two databases (100k rows, skewed), against a loop of Router.run
over the shards and against a hand-written UNION ALL over each database's shards, one statement per database, run in
parallel (no claims: the floor for one statement a database); prepared (psycopg's steady state, after five runs)
and not (as through a transaction pooler)."""
from __future__ import annotations

import heapq
import itertools
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from common import row, section, servers, table

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout
from pgidgen.routing import Router

SHARDS = int(os.environ.get("BENCH_FANOUT_SHARDS", "2000"))
ROWS = int(os.environ.get("BENCH_FANOUT_ROWS", "100000"))
RUNS = int(os.environ.get("BENCH_FANOUT_RUNS", "11"))
LOOPS = int(os.environ.get("BENCH_FANOUT_LOOPS", "3"))
LIMIT = 50
NEWEST = "SELECT id, user_id, caption FROM photos"
COUNT = "SELECT count(*) FROM photos"
#: each database's shards made a batch at a time (one transaction holding thousands of new tables' locks slows down
#: every statement after it)
BATCH = 100


def fill(dsn: str, shards: list[int]) -> None:
    """photos in each shard, skewed: from 1 to 2 x ROWS/SHARDS - 1 rows (about ROWS in all)."""
    spread = 2 * (ROWS // SHARDS) - 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(0, len(shards), BATCH):
            conn.execute(  # no parameters: the % are format()'s
                "DO $$ DECLARE s int; BEGIN FOREACH s IN ARRAY ARRAY[" + ",".join(map(str, shards[i:i + BATCH])) + "] LOOP"
                " EXECUTE format('CREATE TABLE %I.photos (id bigint PRIMARY KEY DEFAULT %I.next_id(), user_id bigint NOT NULL,"
                " caption text)', 'shard_' || s, 'shard_' || s);"
                " EXECUTE format('INSERT INTO %I.photos (user_id, caption) SELECT g, md5(g::text) FROM generate_series(1, %s) g',"
                f" 'shard_' || s, 1 + (s * 37) % {spread});"
                " EXECUTE format('ANALYZE %I.photos', 'shard_' || s);"  # as autovacuum would have: no plan for tables of unknown size
                " END LOOP; END $$")


def union(shards: list[int], part: str, outer: str) -> str:
    return outer.format(" UNION ALL ".join(f"({part.format(s=s)})" for s in shards))


def run() -> None:
    with servers(2, autovacuum="off") as srv:
        config = Config(layout=Layout.make(), databases={"db1": srv[0].dsn, "db2": srv[1].dsn})
        t0 = time.perf_counter()
        assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
        owned: dict[str, list[int]] = {}
        for name, dsn in config.databases.items():
            with psycopg.connect(dsn) as conn:
                owned[name] = [r[0] for r in conn.execute("SELECT shard FROM pgidgen.shards WHERE state = 'active' ORDER BY shard")]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda n: fill(config.databases[n], owned[n]), owned))
        total = sum(1 + (s * 37) % (2 * (ROWS // SHARDS) - 1) for s in range(SHARDS))
        print(f"  set up {SHARDS} shards, {total} rows on two databases in {time.perf_counter() - t0:.0f}s", flush=True)

        plain = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in config.databases.items()}
        hand_newest = {n: union(s, "SELECT id, user_id, caption FROM shard_{s}.photos ORDER BY id DESC LIMIT 50",
                                "SELECT * FROM ({}) AS u ORDER BY id DESC LIMIT 50") for n, s in owned.items()}
        hand_count = {n: union(s, "SELECT count(*) AS n FROM shard_{s}.photos", "SELECT sum(n) FROM ({}) AS u") for n, s in owned.items()}
        threads = ThreadPoolExecutor(2)
        received: dict[str, int] = {}

        def by_hand(texts: dict[str, str]) -> Callable[[], Any]:
            def each(name: str) -> list[Any]:
                return plain[name].execute(texts[name]).fetchall()
            return lambda: list(threads.map(each, texts))

        def newest_by_hand() -> list[Any]:
            parts = by_hand(hand_newest)()
            return list(itertools.islice(heapq.merge(*parts, key=lambda r: r[0], reverse=True), LIMIT))

        def count_by_hand() -> int:
            return sum(int(p[0][0]) for p in by_hand(hand_count)())

        def with_router(router: Router, label: str) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
            def newest() -> list[Any]:
                res = router.fan_out(NEWEST, order_by="-id", limit=LIMIT)
                received[label] = sum(s.result.ntuples for s in res.streams)
                return list(res)

            def count() -> int:
                return int(router.fan_out(COUNT, combine="sum").scalar())

            def newest_loop() -> list[Any]:
                streams = [router.run(s, lambda c: c.execute(NEWEST + " ORDER BY id DESC LIMIT 50").fetchall(), read_only=True)
                           for s in range(SHARDS)]
                received["loop"] = sum(len(s) for s in streams)
                return list(itertools.islice(heapq.merge(*streams, key=lambda r: r[0], reverse=True), LIMIT))

            def count_loop() -> int:
                return sum(int(router.run(s, lambda c: c.execute(COUNT).fetchone()[0], read_only=True)) for s in range(SHARDS))

            return newest, count, newest_loop, count_loop

        with Router(config, listen=False, max_size=2) as router, \
                Router(Config(layout=config.layout, databases=config.databases, poolers=dict.fromkeys(config.databases, "transaction")),
                       listen=False, max_size=2) as unprepared:
            newest, count, newest_loop, count_loop = with_router(router, "fan_out")
            newest_u, count_u, _, _ = with_router(unprepared, "fan_out, unprepared")
            reference = newest_by_hand()
            for f in (newest, newest_loop, newest_u):
                assert f() == reference, f
            for f in (count, count_loop, count_u):
                assert f() == count_by_hand() == total, f

            def hand_unprepared(texts: dict[str, str]) -> Callable[[], Any]:
                def each(name: str) -> list[Any]:
                    return plain[name].execute(texts[name], prepare=False).fetchall()
                return lambda: list(threads.map(each, texts))

            for what, cases in (
                ("the 50 newest rows", {"fan_out": newest, "hand-written UNION ALL": newest_by_hand,
                                        "fan_out, unprepared": newest_u, "hand-written, unprepared": hand_unprepared(hand_newest),
                                        "loop of Router.run": newest_loop}),
                ("a count", {"fan_out": count, "hand-written UNION ALL": count_by_hand,
                             "fan_out, unprepared": count_u, "hand-written, unprepared": hand_unprepared(hand_count),
                             "loop of Router.run": count_loop}),
            ):
                section(f"{what} across {SHARDS} shards on two databases: median of {RUNS} (the loop: of {LOOPS}), ms")
                for f in cases.values():  # past psycopg's prepare threshold (5): the steady state of a query run again
                    for _ in range(6 if f not in (newest_loop, count_loop) else 1):
                        f()
                times: dict[str, list[float]] = {k: [] for k in cases}
                for i in range(RUNS):  # in turns, so the load of a shared machine falls on all alike
                    for k, f in cases.items():
                        if f in (newest_loop, count_loop) and i >= LOOPS:
                            continue
                        t = time.perf_counter()
                        f()
                        times[k].append(time.perf_counter() - t)
                ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
                row("fan_out", ms["fan_out"], "ms", ms["hand-written UNION ALL"], "of the hand-written UNION ALL")
                row("loop of Router.run", ms["loop of Router.run"], "ms", ms["fan_out"], "of fan_out")
                row("hand-written UNION ALL, one statement a database", ms["hand-written UNION ALL"], "ms")
                row("fan_out, nothing prepared", ms["fan_out, unprepared"], "ms", ms["hand-written, unprepared"],
                    "of the hand-written, unprepared")
                row("hand-written, unprepared", ms["hand-written, unprepared"], "ms")
            table([("rows the client received for the 50 newest",
                    f"fan_out {received['fan_out']} (at most 50 a chunk of 100 shards), the loop {received['loop']}, the hand-written 100")])
        for c in plain.values():
            c.close()
        threads.shutdown()
