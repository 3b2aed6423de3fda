"""apply-ddl: a three-table file on 2000 shards over two databases, against psql -f of the same rendered SQL.

Both sides run the SQL pgidgen renders (the file's statements per shard, the ledger rows) in one transaction
per database, the two databases in parallel; apply-ddl additionally reads and locks every catalog, plans, and
parses the file. Goal: at most 1.1x psql's time.
"""
from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from common import best_of, client, row, section, servers, table

from pgidgen.config import Config
from pgidgen.ddl import parse_file
from pgidgen.ddl.apply import apply_ddl, offline_plan, render_apply
from pgidgen.ddl.drift import DETAIL_SQL, read_drift
from pgidgen.init import init
from pgidgen.layout import Layout

SHARDS = 2000
RUNS = 3
FILE = """CREATE TABLE photos (
  id         bigint PRIMARY KEY DEFAULT next_id(),
  user_id    bigint NOT NULL,
  caption    text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON photos (user_id, id);
CREATE TABLE likes (
  id       bigint PRIMARY KEY DEFAULT next_id(),
  photo_id bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
  user_id  bigint NOT NULL
);
CREATE TABLE comments (
  id       bigint PRIMARY KEY DEFAULT next_id(),
  photo_id bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
  body     text NOT NULL
);
"""


def reset(config: Config) -> None:
    """Back to freshly initialised shards: drop the tables and the ledger (not timed)."""
    for dsn in config.databases.values():
        with psycopg.connect(dsn) as conn:
            shards = [r[0] for r in conn.execute("SELECT shard FROM pgidgen.shards")]
            for i in range(0, len(shards), 250):
                conn.execute(
                    "".join(f"DROP TABLE IF EXISTS shard_{s}.comments, shard_{s}.likes, shard_{s}.photos;" for s in shards[i:i + 250]).encode()
                )
            conn.execute("DELETE FROM pgidgen.ddl_ledger; DELETE FROM pgidgen.ddl_files")


def psql_parallel(files: dict[str, Path], config: Config) -> None:
    procs = [
        subprocess.Popen([client("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", config.databases[name], "-f", str(path)], stdout=subprocess.DEVNULL)
        for name, path in files.items()
    ]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("psql failed")


def run() -> None:
    with servers(2) as started:
        config = Config(layout=Layout.make(), databases={s.name: s.dsn for s in started})
        t0 = time.perf_counter()
        init(config, SHARDS)
        parsed = parse_file(FILE, "schema.sql")
        rendered = render_apply(offline_plan(config, parsed, SHARDS, list(config.databases)))
        tmp = Path(tempfile.mkdtemp(prefix="bench_ddl_"))
        files: dict[str, Path] = {}
        for name, text in rendered.items():
            files[name] = tmp / f"{name}.sql"
            files[name].write_text("BEGIN;\n" + text + "COMMIT;\n", encoding="utf-8")
        section(f"apply-ddl: 3 tables, {SHARDS} shards over 2 databases (setup {time.perf_counter() - t0:.1f}s, median of {RUNS})")
        table([("rendered SQL per database", f"{sum(len(t) for t in rendered.values()) // len(rendered) // 1024} KiB")])
        baseline = best_of(RUNS, lambda: psql_parallel(files, config), setup=lambda: reset(config))
        row("psql -f (both databases in parallel)", baseline, "s")
        ours = best_of(RUNS, lambda: apply_ddl(config, parse_file(FILE, "schema.sql")), setup=lambda: reset(config))
        row("pgidgen apply-ddl (parse, plan, apply, ledger)", ours, "s", baseline, "psql -f")
        with psycopg.connect(config.databases["db2"]) as conn:
            n = conn.execute("SELECT count(*) FROM pgidgen.ddl_ledger").fetchone()
        table([("ledger rows in db2 after the last run", str(n[0] if n else 0))])

        section(f"status --drift: {SHARDS} shards over 2 databases")
        naive = best_of(1, lambda: describe_each_shard(config))
        row("one description query per shard (2000 round trips, 1 run)", naive, "s")
        fingerprints = best_of(RUNS, lambda: read_drift(config))
        row("read_drift (one fingerprint query per database)", fingerprints, "s", naive, "per shard")


def describe_each_shard(config: Config) -> None:
    for dsn in config.databases.values():
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET enable_nestloop = off")
            for (shard,) in conn.execute("SELECT shard FROM pgidgen.shards").fetchall():
                conn.execute(DETAIL_SQL, ([shard],)).fetchall()
