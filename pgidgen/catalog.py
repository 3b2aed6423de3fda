"""Reading a database's pgidgen catalog: the layout it holds, its shards, and foreign schemas in the way."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .idgen import CATALOG_REVISION_SQL
from .layout import Layout

SHARD_SCHEMA_RE = re.compile(r"^shard_(0|[1-9][0-9]*)$")


@dataclass
class CatalogState:
    """What one database holds, as far as pgidgen is concerned."""

    has_catalog: bool = False
    foreign_catalog: bool = False
    layout: Layout | None = None
    shard_count: int | None = None
    generator: str | None = None
    shards: dict[int, str] = field(default_factory=dict)  # shard -> state
    shard_schemas: set[int] = field(default_factory=set)  # schemas named shard_N that exist
    complete: set[int] = field(default_factory=set)  # shard schemas with both sequences and next_id()
    cached: set[int] = field(default_factory=set)  # generator sequences with CACHE > 1: IDs could repeat
    server_version: int = 0
    #: which physical database this is (the server's start time and the database's OID): two config names for
    #: one database (127.0.0.1 and localhost, say) are found out by it
    identity: str = ""
    catalog_revision: int = 0  # see idgen.CATALOG_REVISION; 0 without a catalog
    open_moves: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # shard -> (source, target, step) in its journal

    @property
    def active(self) -> set[int]:
        return {s for s, st in self.shards.items() if st in ("active", "moving")}


def uncatalogued(states: Mapping[str, CatalogState]) -> list[str]:
    """The databases read that have no pgidgen catalog (nor a foreign schema of that name): new ones a move or init
    will fill, or ones whose connection string names another database than init used (a database name left out
    connects to the user's)."""
    return [name for name, st in states.items() if not st.has_catalog and not st.foreign_catalog]


def no_catalog_hint(who: str, shard_count: int | None = None) -> str:
    """What to do about a database without a catalog while shards are in no database: most likely its connection
    string reaches another database than the one init used, and init there would make those shards anew, empty."""
    init = f"pgidgen init --shards {shard_count}" if shard_count is not None else "pgidgen init"
    return f"check that {who}'s connection string names the database init used; if {who} is new, run '{init}'"


#: Which database a connection reached, whatever its config name or connection string (host alias, socket,
#: settings): the server's start time and the database's OID.
IDENTITY_SQL = ("SELECT extract(epoch FROM pg_postmaster_start_time())::text || '/' || d.oid AS identity"
                " FROM pg_database d WHERE d.datname = current_database()")


def read_state(conn: psycopg.Connection[Any], *, schemas: bool = True, shard: int | None = None) -> CatalogState:
    """schemas=False skips the scan of shard schemas (shard_schemas, complete stay empty), the catalog revision and
    the move journal: what routers need, ~1 ms instead of ~100 ms for 2000 shards. shard: scan only that shard's
    schema (shard_schemas, complete and cached say nothing of the others): what a move of it needs."""
    st = CatalogState(server_version=conn.info.server_version)
    row = conn.execute(
        "SELECT n.oid, (SELECT c.oid FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'layout' AND c.relkind = 'r'),"
        " obj_description(n.oid, 'pg_namespace'), i.identity"
        f" FROM ({IDENTITY_SQL}) i"
        " LEFT JOIN pg_namespace n ON n.nspname = 'pgidgen'"
    ).fetchone()
    assert row is not None
    st.identity = str(row[3])
    if row[0] is not None:
        if row[1] is None or row[2] != "pgidgen catalog":
            st.foreign_catalog = True
        else:
            st.has_catalog = True
    if st.has_catalog:
        lay = conn.execute(
            "SELECT epoch_ms, time_bits, shard_bits, sequence_bits, shard_count, generator FROM pgidgen.layout"
        ).fetchone()
        if lay is not None:
            st.layout = Layout(epoch_ms=lay[0], time_bits=lay[1], shard_bits=lay[2], sequence_bits=lay[3])
            st.shard_count = lay[4]
            st.generator = lay[5]
        st.shards = {int(s): str(state) for s, state in conn.execute("SELECT shard, state FROM pgidgen.shards")}
    if not schemas:
        return st
    if st.has_catalog:  # what init, map and moves need, not a router's map reload
        rev = conn.execute(f"SELECT {CATALOG_REVISION_SQL}, to_regclass('pgidgen.moves') IS NOT NULL").fetchone()
        assert rev is not None
        st.catalog_revision = int(rev[0])
        if rev[1]:
            st.open_moves = {int(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in conn.execute(  # a batch: each of its shards
                "SELECT coalesce(b.shard::int, m.shard), m.source, m.target, m.step FROM pgidgen.moves m"
                " LEFT JOIN LATERAL pg_catalog.jsonb_array_elements_text(m.detail -> 'shards') AS b (shard) ON true"
                " WHERE m.status IN ('running', 'failed')")}
    # One pass over each catalog, grouped by schema: correlated EXISTS per schema made the planner estimate millions
    # at 8192 shards, past the JIT thresholds (15 spent 586 ms of 686 ms compiling what runs in 50 ms).
    for (name, complete, cached) in conn.execute(
        """
        SELECT n.nspname,
               coalesce(s.seqs = 2 AND f.callable AND (f.locked OR f.shared), false),
               coalesce(s.cached, false)
        FROM pg_namespace n
        LEFT JOIN (SELECT c.relnamespace AS nsp, count(*) AS seqs, bool_or(q.seqcache <> 1) AS cached
                   FROM pg_class c JOIN pg_sequence q ON q.seqrelid = c.oid
                   WHERE c.relname IN ('pgidgen_counter', 'pgidgen_offset')
                     AND (%(only)s::text IS NULL OR c.relnamespace = pg_catalog.to_regnamespace(%(only)s))
                   GROUP BY c.relnamespace) s ON s.nsp = n.oid
        LEFT JOIN (SELECT p.pronamespace AS nsp,
                          bool_or(p.proname = 'next_id' AND p.pronargdefaults = p.pronargs) AS callable,  -- as next_id()
                          bool_or(p.proname = 'pgidgen_locked_next_id' AND p.pronargs = 0) AS locked,  -- seqlock's
                          bool_or(p.proname = 'next_id' AND l.lanname = 'sql') AS shared  -- pgidgen.next_id_of()'s
                   FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                   WHERE p.proname IN ('next_id', 'pgidgen_locked_next_id')
                     AND (%(only)s::text IS NULL OR p.pronamespace = pg_catalog.to_regnamespace(%(only)s))
                   GROUP BY p.pronamespace) f ON f.nsp = n.oid
        WHERE n.nspname ~ '^shard_(0|[1-9][0-9]*)$' AND (%(only)s::text IS NULL OR n.nspname = %(only)s)
        """, {"only": None if shard is None else f"shard_{shard}"}
    ):
        shard = int(name[len("shard_"):])
        st.shard_schemas.add(shard)
        if complete:
            st.complete.add(shard)
        if cached:
            st.cached.add(shard)
    return st
