"""import's verify step: rows counted and checksummed per shard (inside the write pause), against counting alone.

One table of 1M rows (bigint, bigint, text, timestamptz) grouped by the shard expression of 2000 shards, as the
source's side of the verify step runs it: the count alone (the baseline), the count with the checksum hashed by
column (hash_record_extended, what built-in types get), and with the checksum of the rows' text (the fallback).
"""
from __future__ import annotations

import psycopg
from common import best_of, row, section, servers

from pgidgen.importing.source import ImportPlan, TablePlan, shard_expr
from pgidgen.importing.sqltext import TEXT_FORM_SQL, checksum_sql

ROWS = 1_000_000
SHARDS = 2000
RUNS = 3


def run() -> None:
    plan = ImportPlan("public", "user_id", SHARDS, 0, [TablePlan("photos", True)], {"db1": list(range(SHARDS))})
    count = f"SELECT {shard_expr('user_id', SHARDS).as_string(None)}, count(*) FROM public.photos GROUP BY 1"
    with servers(1) as (srv,), psycopg.connect(srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE photos (id bigint PRIMARY KEY, user_id bigint NOT NULL, caption text, made timestamptz)")
        c.execute(f"INSERT INTO photos SELECT g, g % 100000, 'caption ' || g, now() - g * interval '1 s' FROM generate_series(1, {ROWS}) g")
        c.execute("VACUUM ANALYZE photos")

        def timed(query: str) -> float:
            def once() -> None:
                with c.transaction():
                    c.execute(TEXT_FORM_SQL.encode())
                    c.execute(query.encode()).fetchall()
            once()  # warm the cache
            return best_of(RUNS, once)

        section(f"{ROWS} rows, {SHARDS} shards, median of {RUNS}")
        base = timed(count)
        row("count per shard", base, "s")
        row("count + checksum by column", timed(checksum_sql(plan, plan.tables[0])), "s", base, "of the count")
        row("count + checksum of the rows' text", timed(checksum_sql(plan, plan.tables[0], by_text=True)), "s", base, "of the count")
