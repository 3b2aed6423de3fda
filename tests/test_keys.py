"""One key -> shard rule: pgidgen.shard_for_key in SQL and Router.shard_for agree on every bigint (property-tested
on a real server), negative keys included."""
from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from pgidgen.config import Config
from pgidgen.db import execute_script
from pgidgen.idgen import CATALOG_REVISION, render_catalog
from pgidgen.init import init
from pgidgen.routing import Router

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
#: the issue's 2000 shards, and an odd count where a sign error cannot hide behind a power of two
COUNTS = {"db1": 2000, "db2": 3}
AGREE_SQL = ("SELECT pgidgen.shard_for_key(k) FROM pg_catalog.unnest(%s::bigint[]) WITH ORDINALITY AS u (k, i)"
             " ORDER BY i")


def test_sql_and_the_router_agree_on_every_bigint(config: Config) -> None:
    """The catalog only (no shards: the rule needs the shard count alone), one connection and one Router per
    shard count; hypothesis sends its keys in batches, one query each."""
    pairs: list[tuple[psycopg.Connection[Any], Router, int]] = []
    try:
        for name, count in COUNTS.items():
            conn = psycopg.connect(config.dsn(name), autocommit=True)
            execute_script(conn, render_catalog(config.layout, shard_count=count))
            router = Router(Config(layout=config.layout, databases={name: config.dsn(name)}), listen=False)
            pairs.append((conn, router, count))

        def agree(keys: list[int]) -> None:
            for conn, router, count in pairs:
                in_sql = [row[0] for row in conn.execute(AGREE_SQL, (keys,))]
                assert in_sql == [router.shard_for(k) for k in keys] == [k % count for k in keys], (count, keys)

        edges = [BIGINT_MIN, BIGINT_MIN + 1, BIGINT_MIN + 1999, -2001, -2000, -1999, -7, -3, -2, -1, 0, 1, 2, 3, 1999, 2000,
                 BIGINT_MAX - 1, BIGINT_MAX]
        agree(edges)
        assert pairs[0][0].execute("SELECT pgidgen.shard_for_key(-7), pgidgen.shard_for_key(NULL)").fetchone() == (1993, None)

        @settings(max_examples=60, deadline=None, database=None)
        @given(st.lists(st.integers(BIGINT_MIN, BIGINT_MAX) | st.integers(-5000, 5000), min_size=1, max_size=400))
        def agree_on(keys: list[int]) -> None:
            agree(keys)

        agree_on()
    finally:
        for conn, router, _ in pairs:
            router.close()
            conn.close()


def test_the_function_is_immutable_and_pins_its_search_path(config: Config) -> None:
    """Usable in an index expression or a generated column, like the ID readers; no schema on the caller's path
    can stand in for its operators."""
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        execute_script(conn, render_catalog(config.layout, shard_count=2000))
        row = conn.execute("SELECT p.provolatile, p.proparallel, p.proisstrict, p.proconfig FROM pg_catalog.pg_proc p"
                           " WHERE p.oid = 'pgidgen.shard_for_key(bigint)'::regprocedure").fetchone()
        assert row == ("i", "s", True, ["search_path=pg_catalog, pg_temp"])
        conn.execute("CREATE TABLE public.users (id bigint PRIMARY KEY, shard int GENERATED ALWAYS AS (pgidgen.shard_for_key(id)) STORED)")
        conn.execute("INSERT INTO public.users (id) VALUES (-7), (2007)")
        assert conn.execute("SELECT id, shard FROM public.users ORDER BY id").fetchall() == [(-7, 1993), (2007, 7)]


def test_an_older_catalog_gets_the_function_from_init(config: Config) -> None:
    """A database initialised before revision 8 has no shard_for_key until init (or a move) brings its catalog up."""
    init(config, 4, ["db1"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgidgen.shard_for_key(bigint)")
        conn.execute("COMMENT ON FUNCTION pgidgen.min_id(timestamptz) IS 'pgidgen catalog revision 7'")
    outcomes = init(config, 4, ["db1"])
    assert [o.summary for o in outcomes] == [f"catalog upgraded to revision {CATALOG_REVISION}, created 0 shards (none)"], outcomes
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        assert conn.execute("SELECT pgidgen.shard_for_key(-1)").fetchone() == (3,)
