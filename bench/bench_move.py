"""move-shard: total time against pg_dump | psql of the same shard, and the write pause a continuous writer sees, at two shard sizes.

Two throwaway servers. For each size: a shard with a table of N rows (bigint ID primary key, an int, a 32-char
text) on db1. Baseline: `pg_dump --schema=shard_1 db1 | psql` into an empty database on db2's server (the
offline way to copy a shard: the writes it misses would be lost). Then `move_shard(shard 1 -> db2)` online: total
time, the pause the mover reports (lock to target commit), and the longest gap between two acknowledged writes as
the writer saw it (that includes noticing the move and re-routing).
A third measurement, the floor, is the part of a move no online machinery adds: the same rows copied the
cheapest way pgidgen knows (binary COPY, psql to psql, into a table created in the same transaction, FREEZE),
the primary key built, then the verification's checksums computed on both sides at once. Copy, key, verify, in
that order, is the move's own order (the key must be there before replication applies updates; the verification
reads both copies after the last change), without the slot, the schema dump, catch-up, the cutover or the
checks. Its ratio to pg_dump | psql is the best this design can show on this machine; the move's ratio to the
floor is what the online machinery costs on top.
All three run under the same load: a writer inserting into the shard continuously (routed by the shard map, as an
application would be), in a process of its own as an application is. (In the mover's process its thread would
compete with the mover for Python's interpreter lock, which no deployment does.)
PostgreSQL 15's launcher starts one subscription worker per wal_retrieve_retry_interval (5 s by default); the
servers here use 200 ms so back-to-back moves in one run do not wait on it.
Timing on a shared machine is noisy: each size runs BENCH_MOVE_ROUNDS rounds (default 3) on a freshly built
shard, and prints medians, the ratio of the medians and every round's; the headline ratio is the median of the
rounds' own ratios (a round's baseline and move ran under the same load). The three parts take turns going
first, second and third from round to round (after the move they read its retired source copy, the same rows):
whatever runs after another's million rows pays for its flushes. A CHECKPOINT on both servers before each timed
part keeps one part's writes from being flushed during the next, and autovacuum is off on the bench's servers:
the baseline leaves a million unfrozen rows, and their vacuum would land in the middle of whichever part comes
next (the move's and the floor's rows go in frozen). BENCH_MOVE_SIZES (default 100000,1000000) picks the sizes.
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import psycopg
from common import client, row, section, servers, table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from movekit import Writer  # noqa: E402

from pgidgen.config import Config  # noqa: E402
from pgidgen.init import init  # noqa: E402
from pgidgen.layout import Layout  # noqa: E402
from pgidgen.move import move_shard  # noqa: E402
from pgidgen.move.verify import compare  # noqa: E402

SIZES = tuple(int(n) for n in os.environ.get("BENCH_MOVE_SIZES", "100000,1000000").split(","))
ROUNDS = int(os.environ.get("BENCH_MOVE_ROUNDS", "3"))


def _db(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    return dsn.rsplit("/", 1)[0] + "/" + name


def build(rows: int, dsn1: str, dsn2: str, tag: str) -> tuple[Config, str, str, float]:
    """A fresh shard of rows rows on db1 (untimed) and empty databases for the baseline, the floor and the move."""
    src, tgt, base = _db(dsn1, f"src_{tag}"), _db(dsn2, f"tgt_{tag}"), _db(dsn2, f"base_{tag}")
    _db(dsn2, f"floor_{tag}")
    config = Config(layout=Layout.make(), databases={"db1": src, "db2": tgt})
    assert all(o.ok for o in init(config, 4, ["db1"]))
    with psycopg.connect(src, autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.t (id bigint PRIMARY KEY DEFAULT shard_1.next_id(), v int, note text)")
        c.execute(f"INSERT INTO shard_1.t (v, note) SELECT g, md5(g::text) FROM generate_series(1, {rows}) g")
        c.execute("VACUUM ANALYZE shard_1.t")
        size_mb = float(c.execute("SELECT pg_total_relation_size('shard_1.t') / 1e6").fetchone()[0])  # type: ignore[index]
    return config, src, base, size_mb


@dataclass
class Seen:
    ids: list[int]
    errors: list[str]
    max_gap: float
    gaps: list[float]  # between two acknowledged writes


class WriterProcess:
    """movekit's Writer, run in a child process; stop() returns what it saw."""

    def __init__(self, dsns: dict[str, str], shard: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.stop_event = ctx.Event()
        self.ready = ctx.Event()
        self.parent, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=self._run, args=(dsns, shard, child), daemon=True)
        self.proc.start()
        self.ready.wait(30)

    def _run(self, dsns: dict[str, str], shard: int, out: object) -> None:
        w = Writer(dsns, shard, delay=0.001)
        w.start()
        self.ready.set()
        self.stop_event.wait()
        w.stop_flag.set()
        w.join()
        out.send((w.ids, w.errors, w.max_gap, w.gaps))  # type: ignore[attr-defined]

    def stop(self) -> Seen:
        self.stop_event.set()
        if not self.parent.poll(60):
            raise RuntimeError(f"the writer process did not report (exit code {self.proc.exitcode})")
        seen = Seen(*self.parent.recv())
        self.proc.join()
        return seen


def baseline(src: str, base: str, schema: str = "shard_1") -> float:
    t0 = time.perf_counter()
    dump = subprocess.Popen([client("pg_dump"), f"--schema={schema}", "-d", src], stdout=subprocess.PIPE)
    feed = dump
    with psycopg.connect(base) as c:
        older = c.info.server_version < 170000
    if older:  # a pg_dump 17+ prints `SET transaction_timeout = 0`, which 15 and 16 reject (as the move drops it)
        feed = subprocess.Popen(["sed", "/^SET transaction_timeout/d"], stdin=dump.stdout, stdout=subprocess.PIPE)
    subprocess.run([client("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", base], stdin=feed.stdout, check=True, stdout=subprocess.DEVNULL)
    for p in {dump, feed}:
        assert p.stdout is not None
        p.stdout.close()
        assert p.wait() == 0
    return time.perf_counter() - t0


def floor(src: str, dst: str, schema: str = "shard_1") -> float:
    """The verified copy with nothing else (see the module docstring): rows, primary key, both checksums."""
    t0 = time.perf_counter()
    out = subprocess.Popen([client("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", src, "-c", f'COPY "{schema}".t (id, v, note) TO STDOUT (FORMAT binary)'],
                           stdout=subprocess.PIPE)
    subprocess.run([client("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-d", dst,
                    "-c", "CREATE SCHEMA shard_1", "-c", "CREATE TABLE shard_1.t (id bigint NOT NULL, v int, note text)",
                    "-c", "COPY shard_1.t (id, v, note) FROM STDIN (FORMAT binary, FREEZE)",
                    "-c", "ALTER TABLE shard_1.t ADD PRIMARY KEY (id)"], stdin=out.stdout, check=True, stdout=subprocess.DEVNULL)
    assert out.stdout is not None
    out.stdout.close()
    assert out.wait() == 0
    with psycopg.connect(src) as s, psycopg.connect(dst) as d:
        checked = compare(s, schema, d, "shard_1", ["t"])
    seconds = time.perf_counter() - t0
    # the writer kept inserting after the copy's snapshot: the counts differ by those rows, not by more
    t = checked.tables[0]
    assert 0 < t.target_rows <= t.source_rows < t.target_rows + 100_000, checked.as_dict()
    return seconds


def checkpoint(*dsns: str) -> None:
    for dsn in dsns:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CHECKPOINT")


@dataclass
class Moved:
    seconds: float
    pause_ms: float
    gap_ms: float
    writes: int
    rejected: int
    phases: list[tuple[str, float]]
    retired: str


def move(config: Config, src: str, running: WriterProcess) -> Moved:
    t0 = time.perf_counter()
    report = move_shard(config, 1, "db2")
    total = time.perf_counter() - t0
    time.sleep(0.5)
    writer = running.stop()
    assert report.retired_schema is not None
    assert report.verification is not None and report.verification.ok
    assert len(set(writer.ids)) == len(writer.ids) and writer.ids == sorted(writer.ids)
    with psycopg.connect(src, autocommit=True) as c:
        marks = c.execute(
            "SELECT step, min(at) FROM pgidgen.move_log WHERE move_id = %s AND event IN ('start', 'done') GROUP BY step ORDER BY 2",
            (report.move_id,)).fetchall()
        # the retired copy's guard calls pgidgen's catalog, which the baseline's empty database lacks
        c.execute(f'DROP TRIGGER pgidgen_retired ON "{report.retired_schema}".t')
    phases = [(a[0], (b[1] - a[1]).total_seconds()) for a, b in pairwise(marks)]
    return Moved(total, report.pause_ms or 0.0, writer.max_gap * 1000, len(writer.ids), len(writer.errors), phases, report.retired_schema)


def drop(dsn: str, *names: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for name in names:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_size(rows: int, dsn1: str, dsn2: str) -> None:
    tag = f"s{rows}"
    bases: list[float] = []
    floors: list[float] = []
    moves: list[Moved] = []
    size_mb = 0.0
    for r in range(ROUNDS):
        config, src, base, size_mb = build(rows, dsn1, dsn2, tag)
        running: WriterProcess | None = WriterProcess(config.databases, 1)
        time.sleep(0.5)
        schema = "shard_1"  # after the move: its retired copy, the same rows
        parts = ["baseline", "floor", "move"]
        for part in parts[r % 3:] + parts[:r % 3]:
            checkpoint(dsn1, dsn2)
            if part == "baseline":
                bases.append(baseline(src, base, schema))
            elif part == "floor":
                floors.append(floor(src, base.rsplit("/", 1)[0] + f"/floor_{tag}", schema))
            else:
                time.sleep(0.5)
                assert running is not None
                moves.append(move(config, src, running))
                # the parts still to come run under a writer as well (it writes to the target now)
                running, schema = WriterProcess(config.databases, 1), moves[-1].retired
        if running is not None:
            running.stop()
        drop(dsn1, f"src_{tag}")
        drop(dsn2, f"tgt_{tag}", f"base_{tag}", f"floor_{tag}")

    med = statistics.median
    section(f"shard of {rows:,} rows ({size_mb:.0f} MB with its index), median of {ROUNDS} rounds")
    paired = med(m.seconds / b for m, b in zip(moves, bases, strict=True))
    print(f"  RATIO move-shard / (pg_dump -n | psql), {rows:,} rows: {paired:.2f}x (median of the rounds' ratios)", flush=True)
    row("pg_dump | psql (baseline, offline; same writer running)", med(bases), "s")
    row("floor: verified copy, nothing else", med(floors), "s", med(bases), "of pg_dump | psql")
    row("move-shard online, total", med(m.seconds for m in moves), "s", med(bases), "of pg_dump | psql")
    row("move-shard over the floor", med(m.seconds for m in moves), "s", med(floors), "of the floor")
    row("write pause reported by move-shard", med(m.pause_ms for m in moves), "ms")
    row("longest gap between acknowledged writes", med(m.gap_ms for m in moves), "ms")
    table([
        ("ratio per round", ", ".join(f"{m.seconds / b:.2f}x" for m, b in zip(moves, bases, strict=True))),
        ("floor's ratio per round", ", ".join(f"{f / b:.2f}x" for f, b in zip(floors, bases, strict=True))),
        ("pause per round (ms)", ", ".join(f"{m.pause_ms:.0f}" for m in moves)),
        ("writes during a move", f"{moves[-1].writes:,} ({moves[-1].rejected} rejected by the old copy and re-routed)"),
    ])
    steps = [step for step, _ in moves[0].phases]
    per_step = {step: med(dict(m.phases).get(step, 0.0) for m in moves) for step in steps}
    table([("phases (s, medians)", ", ".join(f"{step} {secs:.2f}" for step, secs in per_step.items()))])


def run() -> None:
    with servers(2, wal_retrieve_retry_interval="'200ms'", autovacuum="off") as (s1, s2):
        for rows in SIZES:
            one_size(rows, s1.dsn, s2.dsn)


if __name__ == "__main__":
    run()
