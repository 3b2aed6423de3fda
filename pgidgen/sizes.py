"""How big each shard is on disk: what a size-aware rebalance weighs, and what map/status and cleanup report.

A shard's size is its tables' heap, TOAST and indexes (pg_total_relation_size of each table and materialized
view in its schema), read from the catalog in one query per database; retired copies (what a move leaves on the
source) are sized the same way, with how long ago they were retired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

SIZES_SQL = """
SELECT s.shard, s.state,
       coalesce(sum(pg_catalog.pg_total_relation_size(c.oid)) FILTER (WHERE c.relkind IN ('r', 'm')), 0)::bigint,
       extract(epoch FROM pg_catalog.now() - s.updated_at)::float8
FROM pgidgen.shards s
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = s.schema_name
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid
GROUP BY s.shard, s.state, s.updated_at
"""


@dataclass(frozen=True)
class ShardSize:
    shard: int
    state: str
    bytes: int
    age_s: float  # since the row last changed state (for a retired copy: since it was retired)


def read_sizes(conn: psycopg.Connection[Any]) -> dict[int, ShardSize]:
    """Every shard row of this database's catalog with its bytes on disk; {} without a catalog."""
    row = conn.execute("SELECT to_regclass('pgidgen.shards') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return {}
    return {int(r[0]): ShardSize(int(r[0]), str(r[1]), int(r[2]), float(r[3])) for r in conn.execute(SIZES_SQL)}


def human(n: int | float) -> str:
    """Bytes as pg_size_pretty writes them, one decimal above kB: 0 bytes, 48 kB, 3.2 MB, 1.1 GB."""
    if n < 1024:
        return f"{int(n)} bytes"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1024
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "kB" else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
