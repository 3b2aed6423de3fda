"""Shared bench helpers: throwaway servers, timing, ratio printing. Benches print ratios, never assert."""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgidgen import pgbin, sandbox


def client(program: str) -> str:
    """psql, pg_dump, pgbench: the newest client programs pgidgen finds (no system PostgreSQL needed)."""
    return str(pgbin.newest_client(program))


@contextmanager
def servers(count: int, *, major: int | None = None, **settings: str) -> Iterator[list[sandbox.Server]]:
    """count throwaway servers of PostgreSQL `major` (default: PGIDGEN_PG_VERSION, else the newest found)."""
    root = sandbox.make_root()
    started: list[sandbox.Server] = []
    try:
        for i in range(count):
            started.append(sandbox.create_server(root, f"db{i + 1}", settings=settings or None, major=major))
        yield started
    finally:
        sandbox.destroy(started, root)


def postmaster_pid(server: sandbox.Server) -> int:
    return int((Path(server.datadir) / "postmaster.pid").read_text().split()[0])


@contextmanager
def one_cpu(pids: Sequence[int]) -> Iterator[int | None]:
    """This thread (and the threads it starts), and the processes pids (a postmaster: the backends it forks from
    now on; a pgbouncer), on one CPU for the block; the CPU (None where affinity cannot be set).

    On a machine of few shared virtual CPUs a loopback round trip costs 20 us or over 60 us depending on whether
    the client and the server process wake on the same CPU, and which happens sticks to a connection by chance:
    in one run raw libpq's three round trips measured 0.70x of plain psycopg's when all shared one CPU and 2.22x
    when the scheduler placed them. Two connections compared unpinned compare their luck; on one CPU both pay
    the same for a round trip and the ratio is the work each does."""
    with _pinned(pids, apart=False) as cpus:
        yield None if cpus is None else cpus[0]


@contextmanager
def two_cpus(pids: Sequence[int]) -> Iterator[tuple[int, int] | None]:
    """As one_cpu, but this thread on one CPU and the processes pids on another: client and server apart, as on
    two machines, the same for every connection compared (where the scheduler places them, each connection's
    placement is its luck, see one_cpu); the two CPUs (None with fewer than two, or no affinity)."""
    with _pinned(pids, apart=True) as cpus:
        yield cpus


@contextmanager
def _pinned(pids: Sequence[int], *, apart: bool) -> Iterator[tuple[int, int] | None]:
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = {pid: os.sched_getaffinity(pid) for pid in (0, *pids)}
    if apart and len(before[0]) < 2:
        yield None
        return
    kids = {pid: _children(pid) for pid in pids}
    client = max(before[0])
    server = min(before[0]) if apart else client
    try:
        for pid in before:
            os.sched_setaffinity(pid, {client if pid == 0 else server})
        yield client, server
    finally:
        for pid, cpus in before.items():
            # and a postmaster's backends forked in the block: a pgbouncer keeps its server connections from this
            # pass to the next, which would otherwise measure them still pinned
            for p in [pid, *(_children(pid) - kids[pid] if pid else ())]:
                try:
                    if p == pid or os.sched_getaffinity(p) == {server}:
                        os.sched_setaffinity(p, cpus)
                except OSError:
                    pass


def _children(pid: int) -> set[int]:
    """pid's child processes (Linux's /proc; none where it cannot tell)."""
    found: set[int] = set()
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.update(int(c) for c in f.read_text().split())
        except OSError:
            pass
    return found


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(n: int, fn: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
    """Median of n runs (setup not timed)."""
    times = []
    for _ in range(n):
        if setup is not None:
            setup()
        times.append(timed(fn))
    return statistics.median(times)


def psql(dsn: str, *, file: Path | None = None, command: str | None = None, quiet: bool = True) -> None:
    argv = [client("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn]
    if file is not None:
        argv += ["-f", str(file)]
    if command is not None:
        argv += ["-c", command]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL if quiet else None)


def section(title: str) -> None:
    print(f"\n## {title}", flush=True)


def row(label: str, value: float, unit: str, baseline: float | None = None, baseline_name: str = "") -> None:
    text = f"  {label:<48} {value:>12.3f} {unit}"
    if baseline:
        text += f"   ratio {value / baseline:6.2f}x {baseline_name}"
    print(text, flush=True)


def table(rows: Sequence[tuple[str, str]]) -> None:
    for a, b in rows:
        print(f"  {a:<48} {b}", flush=True)


def summed(dsns: Iterable[str], query: str, params: Sequence[Any] = ()) -> int:
    """query's one number on each database, added up."""
    import psycopg

    n = 0
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            r = conn.execute(query.encode(), params).fetchone()
            n += int(r[0]) if r and r[0] is not None else 0
    return n
