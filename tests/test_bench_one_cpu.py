"""bench/common.py's one_cpu pins the client and a server's processes to one CPU for one pass of a bench; the
pass after it must run where the scheduler places it, the server's backends included."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

_spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).resolve().parents[1] / "bench" / "common.py")
assert _spec is not None and _spec.loader is not None
bench_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_common)


def test_a_backend_forked_on_one_cpu_gets_the_postmasters_cpus_back_with_it(pg_servers: list[Any]) -> None:
    """A connection opened in the block and kept past it (as PgBouncer keeps its server connections from the
    pinned pass to the next) must not leave its backend on the one CPU: the next pass would measure it pinned."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two CPUs")
    server = pg_servers[0]
    if server.server is None:
        pytest.skip("needs a throwaway server (its postmaster's pid)")
    pm = bench_common.postmaster_pid(server.server)
    mine, its = os.sched_getaffinity(0), os.sched_getaffinity(pm)
    with bench_common.one_cpu([pm]) as cpu:
        conn = psycopg.connect(server.dsn, autocommit=True)
        backend = int(conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        assert os.sched_getaffinity(backend) == os.sched_getaffinity(pm) == {cpu}
    try:
        assert os.sched_getaffinity(0) == mine and os.sched_getaffinity(pm) == its
        assert os.sched_getaffinity(backend) == its
    finally:
        conn.close()
