"""apply-ddl of CREATE INDEX CONCURRENTLY on every shard, under a writer: the writer's gaps, then a killed apply resumed.

A writer inserts one row at a time into the shards' table, round robin, and records the gap between two of its
inserts. Measured first with no build running (the baseline), then while apply-ddl builds an index concurrently
on every shard: the ratios say how much longer the writer's worst gap is during the build than its median gap
with none (the issue's goal: a max gap under 100 ms on 100k rows x 2000 shards). Then the apply of a second index
is killed (SIGKILL) halfway and run again: every shard must end with one valid index of each name.
Defaults are small (a few minutes here); BENCH_ONLINE_SHARDS=2000 BENCH_ONLINE_ROWS=100000 for the issue's size.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from common import row, section, servers, summed, table

from pgidgen.config import Config, write_config
from pgidgen.ddl.apply import apply_ddl, read_file
from pgidgen.init import init
from pgidgen.layout import Layout

SHARDS = int(os.environ.get("BENCH_ONLINE_SHARDS", "40"))
ROWS = int(os.environ.get("BENCH_ONLINE_ROWS", "20000"))
BASELINE_S = float(os.environ.get("BENCH_ONLINE_BASELINE_S", "3"))


def _write(dsns: dict[str, str], shards: dict[str, list[int]], stop: Any, out: Any) -> None:
    """The application: its own process (as an app is; a thread here would share apply-ddl's interpreter), one row
    at a time into shard after shard; sends back (end time, gap) of each insert and the errors."""
    conns = {n: psycopg.connect(dsn, autocommit=True, application_name="bench-writer") for n, dsn in dsns.items()}
    targets = [(conns[n], s) for n, ss in shards.items() for s in ss]
    gaps: list[tuple[float, float]] = []
    errors: list[str] = []
    last, i = time.time(), 0
    while not stop.is_set():
        conn, s = targets[i % len(targets)]
        i += 1
        try:
            conn.execute(f"INSERT INTO shard_{s}.items (v) VALUES ({i})".encode())
        except psycopg.Error as e:
            errors.append(str(e).splitlines()[0])
        now = time.time()
        gaps.append((now, now - last))
        last = now
    out.send((gaps, errors))


def _sample(dsns: dict[str, str], stop: Any, out: Any) -> None:
    """What the writer's backend is doing, every 10 ms: (server time, state, wait event, database)."""
    conns = {n: psycopg.connect(dsn, autocommit=True) for n, dsn in dsns.items()}
    seen: list[tuple[float, str, str, str]] = []
    while not stop.is_set():
        for n, c in conns.items():
            for t, state, wait in c.execute(
                    "SELECT extract(epoch FROM clock_timestamp())::float8, state, coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                    " FROM pg_stat_activity WHERE application_name = 'bench-writer'"):
                seen.append((t, state, wait if state == "active" else "-", n))
        time.sleep(0.01)
    out.send(seen)


class Writer:
    """The writer and the sampler of its backend, each in a process of its own."""

    def __init__(self, config: Config, shards: dict[str, list[int]]) -> None:
        ctx = multiprocessing.get_context("fork")
        self.stop = ctx.Event()
        (self._wr, self._ww), (self._sr, self._sw) = ctx.Pipe(False), ctx.Pipe(False)
        dsns = dict(config.databases)
        self.procs = [ctx.Process(target=_write, args=(dsns, shards, self.stop, self._ww)),
                      ctx.Process(target=_sample, args=(dsns, self.stop, self._sw))]
        self.gaps: list[float] = []
        self.timed_gaps: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.samples: list[tuple[float, str, str, str]] = []

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def join(self) -> None:
        self.timed_gaps, self.errors = self._wr.recv()
        self.samples = self._sr.recv()
        for p in self.procs:
            p.join()
        self.gaps = [g for _, g in self.timed_gaps]

    def longest(self, n: int) -> list[tuple[float, str]]:
        """The n longest gaps, each with what the writer's backend was seen doing during it (sampled every 10 ms)."""
        out = []
        for end, gap in sorted(self.timed_gaps, key=lambda x: -x[1])[:n]:
            seen = collections.Counter(f"{state}/{wait}@{db}" for t, state, wait, db in self.samples if end - gap <= t <= end)
            out.append((gap, ", ".join(f"{k} x{v}" for k, v in seen.most_common(4)) or "no sample"))
        return out


def measure(config: Config, shards: dict[str, list[int]], during: object) -> Writer:
    w = Writer(config, shards)
    w.start()
    time.sleep(0.3)
    if callable(during):
        during()
    w.stop.set()
    w.join()
    return w


def ms(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def valid_indexes(config: Config, name: str) -> tuple[int, int]:
    valid = invalid = 0
    for dsn in config.databases.values():
        with psycopg.connect(dsn) as conn:
            for (ok,) in conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", (name,)):
                valid, invalid = valid + bool(ok), invalid + (not ok)
    return valid, invalid


def ledger(config: Config, position: int) -> int:
    n = 0
    for dsn in config.databases.values():
        with psycopg.connect(dsn) as conn:
            got = conn.execute("SELECT count(*) FROM pgidgen.ddl_ledger WHERE position = %s", (position,)).fetchone()
            n += int(got[0]) if got else 0
    return n


def run() -> None:
    with servers(2) as started:
        config = Config(layout=Layout.make(), databases={s.name: s.dsn for s in started})
        tmp = Path(tempfile.mkdtemp(prefix="bench_ddl_online_"))
        t0 = time.perf_counter()
        init(config, SHARDS)
        (tmp / "items.sql").write_text("CREATE TABLE items (id bigint PRIMARY KEY DEFAULT next_id(), v int, note text);\n")
        apply_ddl(config, read_file(tmp / "items.sql"))
        shards: dict[str, list[int]] = {}

        def load(name: str) -> None:
            with psycopg.connect(config.databases[name], autocommit=True) as conn:
                shards[name] = [r[0] for r in conn.execute("SELECT shard FROM pgidgen.shards ORDER BY 1")]
                for s in shards[name]:
                    # ids 1..ROWS, below any next_id(): 200M calls of next_id() would take the size hours to load
                    conn.execute(f"INSERT INTO shard_{s}.items (id, v, note) SELECT g, g, md5(g::text) FROM generate_series(1, {ROWS}) g".encode())
                conn.execute(b"VACUUM ANALYZE")

        with ThreadPoolExecutor(max_workers=len(config.databases)) as pool:
            list(pool.map(load, config.databases))
        section(f"CREATE INDEX CONCURRENTLY on {ROWS} rows x {SHARDS} shards over 2 databases, under a writer (setup {time.perf_counter() - t0:.1f}s)")

        base = measure(config, shards, lambda: time.sleep(BASELINE_S))
        (tmp / "idx_v.sql").write_text("CREATE INDEX CONCURRENTLY items_v_idx ON items (v);\n")
        took: list[float] = []
        build = measure(config, shards, lambda: took.append(_timed_apply(config, tmp / "idx_v.sql")))
        median = statistics.median(base.gaps)
        row("writer: median gap, no build", median * 1000, "ms")
        row("writer: p99 gap, no build", ms(base.gaps, 0.99), "ms", median * 1000, "median")
        row("writer: max gap, no build", max(base.gaps) * 1000, "ms", median * 1000, "median")
        row("writer: median gap during the build", statistics.median(build.gaps) * 1000, "ms", median * 1000, "median")
        row("writer: p99 gap during the build", ms(build.gaps, 0.99), "ms", median * 1000, "median")
        row("writer: max gap during the build", max(build.gaps) * 1000, "ms", median * 1000, "median")
        row("writer: max gap during the build, vs with none", max(build.gaps) * 1000, "ms", max(base.gaps) * 1000, "max, no build")
        row("apply-ddl (all shards, both databases in parallel)", took[0], "s")
        table([("writer inserts during the build / errors", f"{len(build.gaps)} / {len(build.errors + base.errors)}"),
               ("valid / invalid items_v_idx", "{} / {}".format(*valid_indexes(config, "items_v_idx")))])
        print("  the writer's longest gaps during the build, and its backend meanwhile (state/wait event@database, every 10 ms):")
        for gap, seen in build.longest(5):
            print(f"    {gap * 1000:9.1f} ms  {seen}")
        table([("the databases' size / this machine's memory", f"{_database_bytes(config) / 2**30:.1f} / {_memory_bytes() / 2**30:.1f} GiB")])

        # one build at a time (--jobs 1) instead of both databases at once: half the reads competing with the writer's
        (tmp / "idx_v_desc.sql").write_text("CREATE INDEX CONCURRENTLY items_v_desc_idx ON items (v DESC);\n")
        took1: list[float] = []
        one = measure(config, shards, lambda: took1.append(_timed_apply(config, tmp / "idx_v_desc.sql", jobs=1)))
        row("writer: p99 gap during a build with --jobs 1", ms(one.gaps, 0.99), "ms", median * 1000, "median")
        row("writer: max gap during a build with --jobs 1", max(one.gaps) * 1000, "ms", max(build.gaps) * 1000, "max, both at once")
        row("apply-ddl --jobs 1", took1[0], "s", took[0], "both at once")
        for gap, seen in one.longest(3):
            print(f"    {gap * 1000:9.1f} ms  {seen}")

        section("the apply of a second index killed halfway (SIGKILL), then run again")
        write_config(tmp / "pgidgen.toml", config.layout, dict(config.databases))
        (tmp / "idx_note.sql").write_text("CREATE INDEX CONCURRENTLY items_note_idx ON items (note);\n")
        cmd = [sys.executable, "-m", "pgidgen", "--config", str(tmp / "pgidgen.toml"), "apply-ddl", str(tmp / "idx_note.sql"), "--json"]
        position = _last_position(config) + 1  # the ledger's position of this file
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and ledger(config, position) < SHARDS // 2:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done_before = ledger(config, position)
        left = valid_indexes(config, "items_note_idx")
        again = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        table([("shards recorded when killed", f"{done_before} of {SHARDS}"),
               ("valid / invalid items_note_idx when killed", "{} / {}".format(*left)),
               ("second run's exit status", str(again.returncode)),
               ("valid / invalid items_note_idx after it", "{} / {}".format(*valid_indexes(config, "items_note_idx"))),
               ("shards recorded after it", f"{ledger(config, position)} of {SHARDS}")])


def _timed_apply(config: Config, path: Path, jobs: int | None = None) -> float:
    t0 = time.perf_counter()
    apply_ddl(config, read_file(path), jobs=jobs)
    return time.perf_counter() - t0


def _database_bytes(config: Config) -> int:
    return summed(config.databases.values(), "SELECT pg_database_size(current_database())")


def _last_position(config: Config) -> int:
    with psycopg.connect(next(iter(config.databases.values()))) as conn:
        got = conn.execute("SELECT coalesce(max(position), 0) FROM pgidgen.ddl_ledger").fetchone()
        return int(got[0]) if got else 0


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
