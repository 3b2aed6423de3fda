"""next_id(): cost per ID, concurrent sessions, INSERT throughput and index size, against its baselines.

Baselines measured in the same run: bare nextval(), gen_random_uuid(), Instagram's published PL/pgSQL
next_id() (bench/instagram.sql), bigserial and uuid keys. The machine is shared and noisy: each figure is the
best of a few interleaved rounds; read the ratios.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from common import client, psql, row, section, servers

from pgidgen.config import Config
from pgidgen.idgen import render_shard
from pgidgen.init import init
from pgidgen.layout import Layout
from pgidgen.sandbox import Server

HERE = Path(__file__).resolve().parent
IDS = int(os.environ.get("BENCH_NEXT_ID_IDS", "1000000"))
ROUNDS = int(os.environ.get("BENCH_RUNS", "3"))
PGBENCH_SECONDS = int(os.environ.get("BENCH_PGBENCH_SECONDS", "3"))
PGBENCH_ROUNDS = int(os.environ.get("BENCH_PGBENCH_ROUNDS", "5"))
DURABLE_ROUNDS = int(os.environ.get("BENCH_PGBENCH_DURABLE_ROUNDS", "3"))
INDEX_ROWS = int(os.environ.get("BENCH_INDEX_ROWS", "1000000"))
SESSIONS = (1, 2, 4, 8)

PER_ID = {
    "shard_1.next_id()": "next_id (pgidgen)",
    "shard_15.next_id()": "next_id, seqlock generator (PL/pgSQL of its own)",
    "nextval('public.bare_seq')": "bare nextval",
    "gen_random_uuid()": "gen_random_uuid()",
    "insta5.next_id()": "Instagram's published PL/pgSQL",
}


def pgbench_bin() -> str:
    return client("pgbench")


def per_id_costs(dsn: str) -> dict[str, float]:
    """Microseconds per ID: SELECT count(f()) FROM generate_series(1, IDS), best of interleaved rounds."""
    best = {expr: float("inf") for expr in PER_ID}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(ROUNDS):
            for expr in PER_ID:
                t0 = time.perf_counter()
                conn.execute(f"SELECT count({expr}) FROM generate_series(1, {IDS})")
                best[expr] = min(best[expr], time.perf_counter() - t0)
    return {expr: t / IDS * 1e6 for expr, t in best.items()}


def concurrent_rate(dsn: str, exprs: list[str], total: int) -> float:
    """IDs per second with one session per expression, all started together."""
    per = total // len(exprs)
    conns = [psycopg.connect(dsn, autocommit=True) for _ in exprs]
    barrier = threading.Barrier(len(exprs) + 1)
    done: list[float] = []

    def work(conn: psycopg.Connection, expr: str) -> None:
        barrier.wait()
        conn.execute(f"SELECT count({expr}) FROM generate_series(1, {per})")
        done.append(time.perf_counter())

    threads = [threading.Thread(target=work, args=(c, e)) for c, e in zip(conns, exprs, strict=True)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return per * len(exprs) / (max(done) - t0)


def best_rate(fn: Callable[[], float]) -> float:
    return max(fn() for _ in range(ROUNDS))


def pgbench_tps(server: Server, table: str, tmp: Path, mode: str) -> float:
    script = tmp / f"{table}.sql"
    script.write_text(f"INSERT INTO {table} (v) VALUES (1);\n")
    out = subprocess.run(
        [pgbench_bin(), "-n", "-M", mode, "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-c", "4", "-j", "2",
         "-T", str(PGBENCH_SECONDS), "-f", str(script), "app"],
        check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if not m:
        raise RuntimeError(f"pgbench printed no tps: {out[-300:]}")
    return float(m.group(1))


#: pgbench's tables: (table, key column, label). Autovacuum is off on them: an ANALYZE that lands in one table's
#: run and not in another's skewed single rounds by 10-20%. The last key, a PL/pgSQL function that only returns
#: nextval, is the floor for any generator written in PL/pgSQL: the cost of calling one from a column default.
PGBENCH_TABLES = (
    ("t_bigserial", "id bigserial PRIMARY KEY", "bigserial key"),
    ("t_next_id", "id bigint PRIMARY KEY DEFAULT shard_1.next_id()", "DEFAULT shard_1.next_id() key"),
    ("t_seqlock", "id bigint PRIMARY KEY DEFAULT shard_15.next_id()", "DEFAULT next_id() key, seqlock generator"),
    ("t_uuid", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()", "uuid key (gen_random_uuid)"),
    ("t_plpgsql", "id bigint PRIMARY KEY DEFAULT public.plpgsql_nextval()", "DEFAULT one-line PL/pgSQL nextval"),
)


def create_pgbench_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE public.plpgsql_seq")
        conn.execute("CREATE FUNCTION public.plpgsql_nextval() RETURNS bigint LANGUAGE plpgsql"
                     " AS $$BEGIN RETURN nextval('public.plpgsql_seq'); END$$")
        for table, key, _ in PGBENCH_TABLES:
            conn.execute(f"CREATE TABLE {table} ({key}, v int) WITH (autovacuum_enabled = off)")


def pgbench_compare(server: Server, tmp: Path, rounds: int) -> None:
    """simple: every INSERT is parsed and planned (psql, drivers without server-side prepare);
    prepared: planned once per connection (psycopg 3 after 5 runs, JDBC, asyncpg, pgx, npgsql).
    The machine is shared: load drifts within a run. Each round runs the tables back to back (in alternating
    order), and the ratio printed is the median over rounds of each round's own ratio."""
    modes = ("simple", "prepared")
    tables = [t for t, _, _ in PGBENCH_TABLES]
    runs: dict[tuple[str, str], list[float]] = {(m, t): [] for m in modes for t in tables}
    for r in range(rounds):
        for m in modes:
            for t in (tables if r % 2 == 0 else tables[::-1]):
                runs[m, t].append(pgbench_tps(server, t, tmp, m))
    for m in modes:
        base = runs[m, "t_bigserial"]
        for t, _, label in PGBENCH_TABLES:
            ratios = sorted(x / b for x, b in zip(runs[m, t], base, strict=True))
            print(f"  {label + ', -M ' + m:<48} {statistics.median(runs[m, t]):>12.0f} tps   ratio {ratios[len(ratios) // 2]:6.2f}x"
                  f" of bigserial (median of {len(ratios)} rounds; range {ratios[0]:.2f}-{ratios[-1]:.2f})", flush=True)


def run() -> None:
    with servers(1) as srv, tempfile.TemporaryDirectory() as tmp_dir:
        server = srv[0]
        dsn = server.dsn
        tmp = Path(tmp_dir)
        layout = Layout.make()
        init(Config(layout=layout, databases={"db1": dsn}), 16)
        with psycopg.connect(dsn, autocommit=True) as conn:  # shard 15 made again by the seqlock generator (shards before it)
            conn.execute("DROP SCHEMA shard_15 CASCADE")
            conn.execute("DELETE FROM pgidgen.shards WHERE shard = 15")
            conn.execute(render_shard(layout, 15, generator="seqlock").encode())
        psql(dsn, file=HERE / "instagram.sql")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SEQUENCE public.bare_seq")
            for k in range(1, 9):
                conn.execute(f"CREATE SEQUENCE public.bare_seq_{k}")

        section(f"cost per ID in one session: SELECT count(f()) FROM generate_series(1, {IDS}), best of {ROUNDS}")
        costs = per_id_costs(dsn)
        insta = costs["insta5.next_id()"]
        for expr, label in PER_ID.items():
            row(f"{label}  [{expr}]", costs[expr], "us/ID", insta, "of Instagram's")
        nid = costs["shard_1.next_id()"]
        bare = costs["nextval('public.bare_seq')"]
        print(
            f"  => next_id is {insta / nid:.2f}x cheaper than Instagram's; it costs {nid / bare:.2f}x a bare nextval"
            f" and {nid / costs['gen_random_uuid()']:.2f}x gen_random_uuid()",
            flush=True,
        )

        total = max(IDS // 2, 80_000)
        section(f"aggregate IDs/s, {total} IDs split over N concurrent sessions (2 cores), best of {ROUNDS}")
        for n in SESSIONS:
            one = best_rate(lambda: concurrent_rate(dsn, ["shard_1.next_id()"] * n, total))  # noqa: B023 - run within this iteration
            spread = best_rate(lambda: concurrent_rate(dsn, [f"shard_{k + 1}.next_id()" for k in range(n)], total))  # noqa: B023 - run within this iteration
            seq_one = best_rate(lambda: concurrent_rate(dsn, ["nextval('public.bare_seq')"] * n, total))  # noqa: B023 - run within this iteration
            row(f"{n} sessions, next_id, all on shard 1", one / 1e3, "k IDs/s", seq_one / 1e3, "of nextval on one sequence")
            row(f"{n} sessions, next_id, one shard each", spread / 1e3, "k IDs/s", one / 1e3, "of all on one shard")

        section(f"pgbench INSERT throughput, 4 clients, {PGBENCH_SECONDS}s per run, {PGBENCH_ROUNDS} interleaved rounds;"
                " the sandbox server (fsync off: CPU-bound, the worst case for any key function)")
        create_pgbench_tables(dsn)
        pgbench_compare(server, tmp, PGBENCH_ROUNDS)

        section(f"primary-key index size after {INDEX_ROWS} rows (one INSERT ... SELECT each, fresh tables)")
        sizes: dict[str, float] = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in ("t_bigserial", "t_next_id", "t_uuid"):
                conn.execute(f"TRUNCATE {t}")
                conn.execute(f"INSERT INTO {t} (v) SELECT 1 FROM generate_series(1, {INDEX_ROWS})")
                conn.execute(f"VACUUM ANALYZE {t}")
                sizes[t] = conn.execute(f"SELECT pg_relation_size('{t}_pkey')").fetchone()[0] / 2**20
            dup = conn.execute("SELECT count(*) - count(DISTINCT id) FROM t_next_id").fetchone()[0]
        for t, label in (("t_bigserial", "bigserial"), ("t_next_id", "next_id"), ("t_uuid", "uuid (random)")):
            row(label, sizes[t], "MiB", sizes["t_bigserial"], "of bigserial")
        print(f"  (duplicates among the {INDEX_ROWS} next_id keys: {dup})", flush=True)

    with servers(1, fsync="on", full_page_writes="on") as srv, tempfile.TemporaryDirectory() as tmp_dir:
        durable = srv[0]
        init(Config(layout=Layout.make(), databases={"db1": durable.dsn}), 2)
        section(f"pgbench INSERT throughput as above, on a server with PostgreSQL's default durability (fsync and"
                f" full_page_writes on), {DURABLE_ROUNDS} rounds")
        create_pgbench_tables(durable.dsn)
        pgbench_compare(durable, Path(tmp_dir), DURABLE_ROUNDS)
