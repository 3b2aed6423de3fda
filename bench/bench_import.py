"""import: an unsharded database's tables into the shards, under a writer, against `pg_dump -t ... | psql` of the same
tables into one database (issue 33: at most 1.5x; the write pause under 1 s; the pgidgen process's memory bounded).

The source holds users, photos (both with the key, user_id) and likes, which reach it through photos
(`--key-of likes=photo_id:photos.id`): PGIDGEN_BENCH_IMPORT_ROWS rows in all (default 300 000: likes 70%, photos
25%, users 5%; the issue's case is 10M), into PGIDGEN_BENCH_IMPORT_SHARDS shards (default 400; the issue's 2000)
on two databases, one server each, the source on a third. A writer inserts photos and likes into the source from
before the import until the cutover refuses its writes. Printed: the baseline's seconds, the import's, their ratio,
the write pause, and the peak resident memory of this process (the import runs in it; a baseline of the process
before the import is printed too).
"""
from __future__ import annotations

import os
import resource
import subprocess
import threading
import time

import psycopg
from common import client, row, section, servers, table
from psycopg.conninfo import make_conninfo

from pgidgen.config import Config
from pgidgen.importing import start_import
from pgidgen.importing.keyof import parse_key_of
from pgidgen.init import init
from pgidgen.layout import Layout

ROWS = int(os.environ.get("PGIDGEN_BENCH_IMPORT_ROWS", "300000"))
SHARDS = int(os.environ.get("PGIDGEN_BENCH_IMPORT_SHARDS", "400"))
TABLES = ("users", "photos", "likes")


def fill(dsn: str) -> None:
    users, photos, likes = ROWS * 5 // 100, ROWS * 25 // 100, ROWS * 70 // 100
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE users (user_id bigint PRIMARY KEY, name text NOT NULL, joined timestamptz NOT NULL DEFAULT now())")
        c.execute("CREATE TABLE photos (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users, caption text,"
                  " taken timestamptz NOT NULL DEFAULT now())")
        c.execute("CREATE TABLE likes (id bigserial PRIMARY KEY, photo_id bigint NOT NULL REFERENCES photos ON DELETE CASCADE,"
                  " liker bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())")
        c.execute("CREATE INDEX ON photos (user_id)")
        c.execute("CREATE INDEX ON likes (photo_id)")
        c.execute(f"INSERT INTO users (user_id, name) SELECT g, 'user ' || g FROM generate_series(1, {users}) g")
        c.execute(f"INSERT INTO photos (user_id, caption) SELECT 1 + g % {users}, repeat('caption ', 4) || g FROM generate_series(1, {photos}) g")
        c.execute(f"INSERT INTO likes (photo_id, liker) SELECT 1 + g % {photos}, g % 1000 FROM generate_series(1, {likes}) g")
        c.execute("VACUUM ANALYZE")


class Writer(threading.Thread):
    """Inserts a photo and a like on it into the source, again and again, until a write is refused."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.acked, self.refused = dsn, 0, ""

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            n = 0
            while True:
                try:
                    with c.transaction():
                        got = c.execute("INSERT INTO photos (user_id, caption) VALUES (%s, 'new') RETURNING id", (1 + n % 100,)).fetchone()
                        assert got is not None
                        c.execute("INSERT INTO likes (photo_id, liker) VALUES (%s, 1)", (got[0],))
                except psycopg.Error as e:
                    self.refused = str(e).splitlines()[0]
                    return
                self.acked += 1
                n += 1
                time.sleep(0.005)


def run() -> None:
    with servers(3) as (db1, db2, src):
        fill(src.dsn)
        with psycopg.connect(db1.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE baseline")
        section(f"{ROWS} rows ({', '.join(TABLES)}), likes through photos; {SHARDS} shards on 2 databases; a writer on the source")
        t0 = time.monotonic()
        dump = subprocess.Popen([client("pg_dump"), "-d", src.dsn, *[a for t in TABLES for a in ("-t", f"public.{t}")]], stdout=subprocess.PIPE)
        subprocess.run([client("psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", make_conninfo(db1.dsn, dbname="baseline")], stdin=dump.stdout,
                       stdout=subprocess.DEVNULL, check=True)
        dump.wait()
        baseline = time.monotonic() - t0
        row("pg_dump -t ... | psql into one database", baseline, "s")

        config = Config(layout=Layout.make(), databases={"db1": db1.dsn, "db2": db2.dsn})
        init(config, SHARDS)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        writer = Writer(src.dsn)
        writer.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        marks: list[tuple[str, float]] = []
        result = start_import(config, src.dsn, schema="public", key="user_id", skip=[],
                              key_of=parse_key_of(["likes=photo_id:photos.id"]), hook=lambda at: marks.append((at, time.monotonic())))
        took = time.monotonic() - t0
        writer.join(10)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        row("pgidgen import (copy, follow, cutover, verify)", took, "s", baseline, "pg_dump | psql (issue 33: <= 1.5x)")
        row("write pause", (result.pause_s or 0.0) * 1000, "ms", 1000.0, "of 1 s (issue 33: < 1 s)")
        table([("rows verified", f"{sum(result.verified.values())} ({', '.join(f'{t} {n}' for t, n in result.verified.items())})"),
               ("keys the pause compared", "every row" if result.pause_checked is None else
                f"{result.pause_checked} (the rest before the pause, while the source wrote)"),
               ("writer", f"{writer.acked} photos with a like acknowledged, then: {writer.refused[:100]}"),
               ("its steps, s from the start", ", ".join(f"{at} {t - t0:.2f}" for at, t in marks)),
               ("peak memory of this process", f"{peak / 1024:.0f} MiB ({before / 1024:.0f} MiB before the import)")])
