"""rebalance at fleet scale: 2000 small shards from one database to two, in batches, against moving them one at a time.

Servers of each major in BENCH_REBALANCE_MAJORS (default "15 18"), with the sandbox's settings and PostgreSQL's
own wal_retrieve_retry_interval (5 s: on 15 the launcher starts a new subscription's apply worker at most that
often, which is what made one-shard moves slow there). `pgidgen init --shards N` on db1 (N = BENCH_REBALANCE_SHARDS,
default 2000), two tables per shard with 20-100 rows each; then `rebalance --parallel 2` onto db1..dbK for each K in
BENCH_REBALANCE_DATABASES (default "2"; "2 4" for 1 -> 4 as well), on fresh servers each time. Four shards that move
take writes all along from writers in processes of their own (routed by the map, as applications are): the
longest gap between two of their acknowledged writes and the p99 of those gaps are printed with the longest pause
a batch reported.
Baseline, same run, same servers: BENCH_REBALANCE_SINGLE (default 20) moves of one shard each (a batch of one,
what rebalance did before batches), two at a time, as moves per second and the time 1000 moves would take at that
rate.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from bench_move import WriterProcess
from common import section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgidgen import sandbox  # noqa: E402
from pgidgen.config import Config  # noqa: E402
from pgidgen.init import init  # noqa: E402
from pgidgen.layout import Layout  # noqa: E402
from pgidgen.move import move_shard, move_shards  # noqa: E402
from pgidgen.move.rebalance import plan_rebalance, rebalance  # noqa: E402

MAJORS = [int(v) for v in os.environ.get("BENCH_REBALANCE_MAJORS", "15 18").split()]
SHARDS = int(os.environ.get("BENCH_REBALANCE_SHARDS", "2000"))
TARGETS = [int(v) for v in os.environ.get("BENCH_REBALANCE_DATABASES", "2").split()]
SINGLE = int(os.environ.get("BENCH_REBALANCE_SINGLE", "20"))
#: rows of the one big shard in the mixed batch (0: no mixed batch)
MIXED_ROWS = int(os.environ.get("BENCH_REBALANCE_MIXED_ROWS", "100000"))


def build(major: int, databases: int) -> tuple[list[sandbox.Server], Path, Config]:
    root = sandbox.make_root()
    servers = [sandbox.create_server(root, f"db{i + 1}", major=major) for i in range(databases)]
    config = Config(layout=Layout.make(), databases={s.name: s.dsn for s in servers})
    assert all(o.ok for o in init(config, SHARDS, ["db1"]))
    for lo in range(0, SHARDS, 250):  # a connection per 250 shards: one that made thousands of tables grows slow
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("".join(
                f"CREATE TABLE shard_{s}.t (id bigint PRIMARY KEY DEFAULT shard_{s}.next_id(), v int, note text);"
                f" CREATE TABLE shard_{s}.tags (tag text PRIMARY KEY, n serial);"
                f" INSERT INTO shard_{s}.t (v, note) SELECT g, md5(g::text) FROM generate_series(1, {20 + s * 37 % 81}) g;"
                f" INSERT INTO shard_{s}.tags (tag) SELECT 'tag' || g FROM generate_series(1, {20 + s * 13 % 81}) g;\n"
                for s in range(lo, min(lo + 250, SHARDS))))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
    return servers, root, config


def under_writers(config: Config) -> tuple[Any, float, list[Any]]:
    """rebalance --parallel 2 while writers insert into four of the moving shards: its result, its seconds, and
    what each writer saw (checked: no ID twice, none out of order)."""
    moving = [m.shard for m in plan_rebalance(config).moves]
    writers = [WriterProcess(config.databases, s) for s in (moving[0], moving[len(moving) // 3], moving[2 * len(moving) // 3], moving[-1])]
    time.sleep(0.5)
    t0 = time.perf_counter()
    result = rebalance(config, parallel=2)
    seconds = time.perf_counter() - t0
    time.sleep(0.3)
    seen = [w.stop() for w in writers]
    assert result.ok, result.failures[:3]
    for w in seen:
        assert len(w.ids) == len(set(w.ids)) and w.ids == sorted(w.ids), "a writer saw an ID twice or out of order"
    return result, seconds, seen


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)


def one_at_a_time(config: Config, target: str) -> float:
    """SINGLE one-shard moves from db1 to target, two at a time: moves per second."""
    shards = list(range(SINGLE))  # still on db1: rebalance moves the highest-numbered ones
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda s: move_shard(config, s, target), shards))
    return SINGLE / (time.perf_counter() - t0)


def mixed(major: int) -> None:
    """A set of 64 small shards with one of MIXED_ROWS rows among them, moved as one move-shard (its batches), a
    writer on the big shard and one on a small one: the pauses the batches report and the writers' longest gaps."""
    section(f"PostgreSQL {major}: 64 small shards and one of {MIXED_ROWS:,} rows in one move-shard, under writers")
    root = sandbox.make_root()
    servers = [sandbox.create_server(root, f"db{i + 1}", major=major) for i in range(2)]
    try:
        config = Config(layout=Layout.make(), databases={s.name: s.dsn for s in servers})
        assert all(o.ok for o in init(config, 64, ["db1"]))
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            for s in range(64):
                rows = MIXED_ROWS if s == 7 else 20 + s * 37 % 81
                c.execute(f"CREATE TABLE shard_{s}.t (id bigint PRIMARY KEY DEFAULT shard_{s}.next_id(), v int, note text);"
                          f" INSERT INTO shard_{s}.t (v, note) SELECT g, md5(g::text) FROM generate_series(1, {rows}) g")
            c.execute("VACUUM ANALYZE")
        writers = [WriterProcess(config.databases, s) for s in (7, 40)]
        time.sleep(0.5)
        t0 = time.perf_counter()
        reports = move_shards(config, list(range(64)), "db2")
        seconds = time.perf_counter() - t0
        time.sleep(0.3)
        seen = [w.stop() for w in writers]
        for w in seen:
            assert len(w.ids) == len(set(w.ids)) and w.ids == sorted(w.ids), "a writer saw an ID twice or out of order"
        big = next(r for r in reports if 7 in r.shards)
        print(f"  {len(reports)} batches in {seconds:.1f} s; pauses (ms): " + ", ".join(f"{r.pause_ms or 0:.0f}" for r in reports), flush=True)
        print(f"  the big shard's batch: {len(big.shards)} shards, pause {big.pause_ms or 0:.0f} ms", flush=True)
        print("  writers' longest gaps (ms): " + ", ".join(f"shard {s} {max(w.gaps, default=0) * 1000:.0f}" for s, w in zip((7, 40), seen, strict=True)), flush=True)
    finally:
        sandbox.destroy(servers, root)


def run() -> None:
    for major in MAJORS:
        if MIXED_ROWS:
            mixed(major)
        for databases in TARGETS:
            section(f"PostgreSQL {major}: {SHARDS} shards, 1 -> {databases} databases")
            servers, root, config = build(major, databases)
            try:
                result, seconds, seen = under_writers(config)
                moves = len(result.plan.moves)
                pauses = [r.pause_ms or 0.0 for r in result.reports]
                gaps = [g for w in seen for g in w.gaps]
                print(f"  rebalance: {moves} moves in {len(result.reports)} batches, {seconds:.1f} s, {moves / seconds:.1f} moves/s", flush=True)
                print(f"  write pause (reported by the batches): median {statistics.median(pauses):.0f} ms, max {max(pauses):.0f} ms", flush=True)
                longest = max(result.reports, key=lambda r: r.pause_ms or 0.0)
                print(f"  the longest, {len(longest.shards)} shards: " + ", ".join(f"{k} {v:.0f}" for k, v in longest.pause_parts.items()), flush=True)
                sizes = [len(r.shards) for r in result.reports]
                print(f"  batch sizes: first {sizes[0]}, median {statistics.median(sizes):.0f}, max {max(sizes)}", flush=True)
                print(f"  writers' gaps between acknowledged writes: max {max(gaps) * 1000:.0f} ms, p99 {p99(gaps) * 1000:.1f} ms", flush=True)
                rate = one_at_a_time(config, "db2")
                print(f"  baseline, one shard per move: {rate:.2f} moves/s, {1000 / rate:.0f} s for 1000 moves;"
                      f" batches: {moves / seconds / rate:.1f}x the moves per second", flush=True)
            finally:
                sandbox.destroy(servers, root)
