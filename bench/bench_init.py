"""init: `pgidgen init --shards 2000` over two databases vs `psql -f` of the SQL that `--sql` prints; and
`init --shards 8192` (Instagram's layout) on one server of PostgreSQL's default lock settings, where one transaction
of them does not fit: init splits it by the lock table, psql -f runs the same SQL with a COMMIT at the same places."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psycopg
from common import best_of, psql, row, section, servers

from pgidgen.config import Config, write_config
from pgidgen.init import BATCH, SHARD_LOCKS, offline_plan, render_database, render_init
from pgidgen.layout import Layout
from pgidgen.locktable import read_budget, room

SHARDS = int(os.environ.get("BENCH_INIT_SHARDS", "2000"))
#: The layout's shard count, on one server of default lock settings (BENCH_INIT_FULL=0 leaves it out).
FULL = int(os.environ.get("BENCH_INIT_FULL", "8192"))
#: PostgreSQL's defaults for what sizes the lock table (the sandbox raises them for the move tests).
DEFAULT_LOCKS = {"max_locks_per_transaction": "64", "max_connections": "100"}
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
PGIDGEN = str(Path(sys.executable).parent / "pgidgen")


def run() -> None:
    two_databases()
    if FULL:
        full_layout()


def full_layout() -> None:
    with servers(1, **DEFAULT_LOCKS) as srv, tempfile.TemporaryDirectory() as tmp:
        dsn = srv[0].dsn
        layout = Layout.make()
        cfg_path = Path(tmp) / "pgidgen.toml"
        write_config(cfg_path, layout, {"db1": dsn})
        with psycopg.connect(dsn, autocommit=True) as conn:
            per_tx = room(read_budget(conn), 1) // SHARD_LOCKS  # what init gives each transaction there
        chunks = render_database(offline_plan(Config(layout=layout, databases={"db1": dsn}), FULL, ["db1"]), "db1")
        text, in_tx = "BEGIN;\n" + chunks[0], 0
        for chunk in chunks[1:]:
            if in_tx + BATCH > per_tx:
                text, in_tx = text + "COMMIT;\nBEGIN;\n", 0
            text, in_tx = text + chunk, in_tx + BATCH
        sql_file = Path(tmp) / "full.sql"
        sql_file.write_text(text + "COMMIT;\n")

        def reset() -> None:
            admin = dsn.rsplit("/", 1)[0] + "/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("DROP DATABASE IF EXISTS app WITH (FORCE)")
                conn.execute("CREATE DATABASE app")

        section(f"init --shards {FULL} on one server of default lock settings (max_locks_per_transaction 64, max_connections 100),"
                f" median of {RUNS} runs")
        t_psql = best_of(RUNS, lambda: psql(dsn, file=sql_file), reset)
        t_init = best_of(RUNS, lambda: subprocess.run([PGIDGEN, "--config", str(cfg_path), "init", "--shards", str(FULL)], check=True,
                                                      stdout=subprocess.DEVNULL), reset)
        row(f"psql -f, {FULL} shards, COMMIT every ~{per_tx // BATCH * BATCH}", t_psql, "s")
        row(f"pgidgen init, {FULL} shards (chunked by itself)", t_init, "s", t_psql, "of psql (goal <= 1.10x)")


def two_databases() -> None:
    with servers(2) as srv, tempfile.TemporaryDirectory() as tmp:
        dsns = {s.name: s.dsn for s in srv}
        layout = Layout.make()
        cfg_path = Path(tmp) / "pgidgen.toml"
        write_config(cfg_path, layout, dsns)
        per_db = render_init(offline_plan(Config(layout=layout, databases=dsns), SHARDS, list(dsns)))
        files = {}
        for name, text in per_db.items():
            files[name] = Path(tmp) / f"{name}.sql"
            files[name].write_text("BEGIN;\n" + text + "COMMIT;\n")
        one_db = render_init(offline_plan(Config(layout=layout, databases=dsns), SHARDS, ["db1"]))["db1"]
        one_file = Path(tmp) / "one.sql"
        one_file.write_text("BEGIN;\n" + one_db + "COMMIT;\n")

        def reset() -> None:
            for s in srv:
                admin = s.dsn.rsplit("/", 1)[0] + "/postgres"
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute("DROP DATABASE IF EXISTS app WITH (FORCE)")
                    conn.execute("CREATE DATABASE app")

        def cli(*args: str) -> None:
            subprocess.run([PGIDGEN, "--config", str(cfg_path), *args], check=True, stdout=subprocess.DEVNULL)

        def psql_sequential() -> None:
            for name in dsns:
                psql(dsns[name], file=files[name])

        def psql_parallel() -> None:
            threads = [threading.Thread(target=psql, args=(dsns[n],), kwargs={"file": files[n]}) for n in dsns]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        section(f"init --shards {SHARDS}, median of {RUNS} runs (each on freshly created databases)")
        t_psql_seq = best_of(RUNS, psql_sequential, reset)
        t_psql_par = best_of(RUNS, psql_parallel, reset)
        t_init = best_of(RUNS, lambda: cli("init", "--shards", str(SHARDS)), reset)
        row("psql -f, db1 then db2 (sequential)", t_psql_seq, "s")
        row("psql -f, db1 and db2 at once (parallel)", t_psql_par, "s")
        row("pgidgen init over db1,db2", t_init, "s", t_psql_seq, "of sequential psql")
        row("pgidgen init over db1,db2", t_init, "s", t_psql_par, "of parallel psql")
        t_psql_one = best_of(RUNS, lambda: psql(dsns["db1"], file=one_file), reset)
        t_init_one = best_of(RUNS, lambda: cli("init", "--shards", str(SHARDS), "--databases", "db1"), reset)
        row(f"psql -f, all {SHARDS} shards on db1", t_psql_one, "s")
        row(f"pgidgen init, all {SHARDS} shards on db1", t_init_one, "s", t_psql_one, "of psql (goal <= 1.10x)")
        t_noop = best_of(RUNS, lambda: cli("init", "--shards", str(SHARDS)))
        row("pgidgen init again (nothing to do)", t_noop, "s")
