"""scale: what reads the fleet, and a rebalance, at 2000 and at 8192 shards (the layout's 13 shard bits), as ratios.

Per major in BENCH_SCALE_MAJORS (default "18 15") and per size in BENCH_SCALE_SHARDS (default "2000 8192"): one
server of that major per database, with max_locks_per_transaction 1024 (so that one database holds 8192 shards
whatever init does with the lock table), `init --shards N` on db1 and two small tables per shard (20-100 rows,
bench_rebalance.build); `rebalance --parallel 2` onto db1..db2 under writers on four moving shards (its seconds,
moves per second, the batches' longest write pause, the writers' longest gap). Then, on that fleet of two databases
and N retired copies: `map`, `status --drift`, `check --no-reach`, `locate` of 100 keys, the Router's first map load
and its re-read after an invalidation, `cleanup --dry-run` and the cleanup itself (median of BENCH_SCALE_ROUNDS,
default 3, except the cleanup). The last size's figures are printed as a ratio of the first's: linear is
8192/2000 = 4.1x. For each count in BENCH_SCALE_MORE (default "4"), the rebalance of the largest size from 1 to
that many databases too ("" for none). A quick run: BENCH_SCALE_MAJORS=18 BENCH_SCALE_SHARDS="500 1000" BENCH_SCALE_MORE="".
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import bench_rebalance
from bench_rebalance import p99, under_writers
from common import section, timed

from pgidgen import sandbox
from pgidgen.check import check
from pgidgen.config import Config
from pgidgen.ddl.drift import read_drift
from pgidgen.move.retired import cleanup_retired, plan_retired
from pgidgen.routing import Router, locate
from pgidgen.shardmap import read_map

MAJORS = [int(v) for v in os.environ.get("BENCH_SCALE_MAJORS", "18 15").split()]
SIZES = [int(v) for v in os.environ.get("BENCH_SCALE_SHARDS", "2000 8192").split()]
MORE = [int(v) for v in os.environ.get("BENCH_SCALE_MORE", "4").split()]
ROUNDS = int(os.environ.get("BENCH_SCALE_ROUNDS", "3"))
#: enough lock table for 8192 shards in one transaction, whatever init does with it (issue 35's chunked init aside)
SETTINGS = {"max_locks_per_transaction": "1024"}


def build(major: int, shards: int, databases: int) -> tuple[list[sandbox.Server], Path, Config]:
    bench_rebalance.SHARDS = shards
    create = sandbox.create_server

    def with_locks(root: Path, name: str, **kw: object) -> sandbox.Server:
        return create(root, name, settings=SETTINGS, **kw)  # type: ignore[arg-type]

    sandbox.create_server = with_locks  # type: ignore[assignment]
    try:
        return bench_rebalance.build(major, databases)
    finally:
        sandbox.create_server = create  # type: ignore[assignment]


def moved(config: Config) -> dict[str, float]:
    """rebalance --parallel 2 under writers on four moving shards: seconds, moves/s, longest pause, longest gap."""
    result, seconds, seen = under_writers(config)
    pauses = [r.pause_ms or 0.0 for r in result.reports]
    gaps = [g for w in seen for g in w.gaps]
    print(f"  rebalance 1 -> {len(config.databases)}: {len(result.plan.moves)} moves in {len(result.reports)} batches, {seconds:.1f} s,"
          f" {len(result.plan.moves) / seconds:.0f} moves/s; pauses median {statistics.median(pauses):.0f} ms, max {max(pauses):.0f} ms;"
          f" writers' longest gap {max(gaps) * 1000:.0f} ms (p99 {p99(gaps) * 1000:.1f} ms)", flush=True)
    return {"rebalance 1 -> 2 (s)": seconds, "longest batch pause (ms)": max(pauses)}


def reads(config: Config) -> dict[str, float]:
    """The fleet's readers, each the median of ROUNDS runs (ms)."""
    def median(fn: Callable[[], object]) -> float:
        return statistics.median(timed(fn) for _ in range(ROUNDS)) * 1000

    def router_load() -> None:
        with Router(config, listen=False) as router:
            router.routing_map()

    out = {
        "map": median(lambda: read_map(config)),
        "status --drift": median(lambda: (read_map(config), read_drift(config))),
        "check --no-reach": median(lambda: check(config, reach=False)),
        "locate (100 keys)": median(lambda: locate(config, keys=range(0, 100_000, 1000))),
        "Router: first map load": median(router_load),
    }
    with Router(config, listen=False) as router:
        router.routing_map()

        def reread() -> None:
            router.invalidate()
            router.routing_map()

        out["Router: re-read after invalidate"] = median(reread)
    out["cleanup --dry-run"] = median(lambda: plan_retired(config))
    t0 = time.perf_counter()
    result = cleanup_retired(config)
    out["cleanup (drops the retired copies)"] = (time.perf_counter() - t0) * 1000
    assert result.ok
    for k, v in out.items():
        print(f"  {k:<48} {v:>10.1f} ms", flush=True)
    return out


def run() -> None:
    for major in MAJORS:
        figures: dict[int, dict[str, float]] = {}
        for shards in SIZES:
            section(f"PostgreSQL {major}: {shards} shards, rebalanced 1 -> 2 databases, then the fleet's readers")
            servers, root, config = build(major, shards, 2)
            try:
                figures[shards] = {**moved(config), **reads(config)}
            finally:
                sandbox.destroy(servers, root)
        if len(SIZES) > 1:
            small, big = SIZES[0], SIZES[-1]
            section(f"PostgreSQL {major}: {big} shards against {small} (linear: {big / small:.1f}x)")
            for k, v in figures[big].items():
                print(f"  {k:<48} {figures[small][k]:>10.1f} -> {v:>10.1f}   ratio {v / figures[small][k]:5.2f}x", flush=True)
        for databases in MORE:
            section(f"PostgreSQL {major}: {SIZES[-1]} shards, rebalanced 1 -> {databases} databases")
            servers, root, config = build(major, SIZES[-1], databases)
            try:
                moved(config)
            finally:
                sandbox.destroy(servers, root)
