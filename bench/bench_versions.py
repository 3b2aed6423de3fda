"""PostgreSQL 15 and 18 side by side: next_id's cost per ID against Instagram's published function, and a move of a 100k-row shard under a writer against pg_dump | psql, on each major.

The same measurements as bench_next_id (cost per ID in one session) and bench_move (a move under a continuous
writer in a process of its own; the baseline pg_dump --schema | psql into an empty database, under the same
writer), fewer rounds each (BENCH_VERSIONS_ROUNDS, default 2), on two throwaway servers of each major, one major
after the other. The ratios are what to compare across the columns: each is against a baseline measured on the
same major in the same run.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import psycopg
from bench_move import WriterProcess, baseline, build, checkpoint, drop, move
from bench_next_id import per_id_costs
from common import psql, section, servers, table

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout

HERE = Path(__file__).resolve().parent
MAJORS = tuple(int(m) for m in os.environ.get("BENCH_VERSIONS", "15 18").split())
ROUNDS = int(os.environ.get("BENCH_VERSIONS_ROUNDS", "2"))
ROWS = 100_000


def next_id_costs(dsn: str) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS nid WITH (FORCE)")
        c.execute("CREATE DATABASE nid")
    db = dsn.rsplit("/", 1)[0] + "/nid"
    init(Config(layout=Layout.make(), databases={"db1": db}), 16)
    psql(db, file=HERE / "instagram.sql")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE public.bare_seq")
    return per_id_costs(db)


def moves(dsn1: str, dsn2: str) -> tuple[float, float, float]:
    """Medians: (move seconds, pg_dump | psql seconds, pause ms)."""
    tag = f"v{ROWS}"
    bases, secs, pauses = [], [], []
    for _ in range(ROUNDS):
        config, src, base, _size = build(ROWS, dsn1, dsn2, tag)
        running = WriterProcess(config.databases, 1)
        time.sleep(0.5)
        checkpoint(dsn1, dsn2)
        bases.append(baseline(src, base))
        checkpoint(dsn1, dsn2)
        time.sleep(0.5)
        m = move(config, src, running)
        secs.append(m.seconds)
        pauses.append(m.pause_ms)
        drop(dsn1, f"src_{tag}")
        drop(dsn2, f"tgt_{tag}", f"base_{tag}", f"floor_{tag}")
    med = statistics.median
    return med(secs), med(bases), med(pauses)


def run() -> None:
    results: dict[int, dict[str, float]] = {}
    for major in MAJORS:
        with servers(2, major=major, wal_retrieve_retry_interval="'200ms'") as (s1, s2):
            costs = next_id_costs(s1.dsn)
            seconds, base, pause = moves(s1.dsn, s2.dsn)
        results[major] = {"nid": costs["shard_1.next_id()"], "insta": costs["insta5.next_id()"],
                          "bare": costs["nextval('public.bare_seq')"], "move": seconds, "base": base, "pause": pause}
        print(f"  PostgreSQL {major}: done", flush=True)
    section("PostgreSQL " + " | ".join(str(m) for m in MAJORS) + " (ratios against baselines of the same major, same run)")

    def cells(fmt: str) -> str:
        return " | ".join(fmt.format(**r) for r in results.values())

    table([
        ("next_id us/ID", cells("{nid:.3f}")),
        ("  Instagram's published function us/ID", cells("{insta:.3f}")),
        ("  next_id / Instagram's", " | ".join(f"{r['nid'] / r['insta']:.2f}x" for r in results.values())),
        ("  next_id / a bare nextval", " | ".join(f"{r['nid'] / r['bare']:.2f}x" for r in results.values())),
        (f"move of {ROWS:,} rows under a writer (s)", cells("{move:.2f}")),
        ("  pg_dump | psql of the same shard (s)", cells("{base:.2f}")),
        ("  move / pg_dump | psql", " | ".join(f"{r['move'] / r['base']:.2f}x" for r in results.values())),
        ("  write pause (ms)", cells("{pause:.0f}")),
    ])


if __name__ == "__main__":
    run()
