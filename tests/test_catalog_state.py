"""read_state's scan of the shard schemas: which are complete (both generator sequences and a next_id() of either
generator) and which have a sequence with CACHE > 1, read for the whole database and for one shard alike."""
from __future__ import annotations

import psycopg
import pytest

from pgidgen.catalog import read_state
from pgidgen.config import Config
from pgidgen.db import execute_script
from pgidgen.idgen import render_shard
from pgidgen.init import init

pytestmark = pytest.mark.sensitive  # a catalog query: runs on every major


def test_the_scan_tells_complete_cached_and_broken_schemas_apart(config: Config) -> None:
    assert all(o.ok for o in init(config, 5, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        execute_script(conn, render_shard(config.layout, 7, generator="seqlock") + render_shard(config.layout, 8, generator="seqlock"))
        for statement in (
            "ALTER SEQUENCE shard_1.pgidgen_offset RENAME TO old_offset",  # a generator sequence missing
            "ALTER FUNCTION shard_2.next_id RENAME TO old_next_id",  # next_id() missing
            "ALTER SEQUENCE shard_3.pgidgen_counter CACHE 10",
            "ALTER FUNCTION shard_4.next_id RENAME TO old_next_id",  # a next_id that needs an argument
            "CREATE FUNCTION shard_4.next_id(n int) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'",  # complete, but it could repeat IDs
            "ALTER FUNCTION shard_8.pgidgen_locked_next_id() RENAME TO old_locked",  # seqlock's next_id() without its slow path
            "CREATE SCHEMA shard_01",  # not a shard's name
            "CREATE SCHEMA shard_9",  # a bare schema of a shard's name
        ):
            conn.execute(statement)

        st = read_state(conn)
        assert st.shard_schemas == {0, 1, 2, 3, 4, 7, 8, 9}
        assert st.complete == {0, 3, 7}
        assert st.cached == {3}
        for shard in (0, 1, 2, 3, 4, 7, 8, 9, 12):
            one = read_state(conn, shard=shard)
            assert (one.shard_schemas, one.complete, one.cached) == (
                st.shard_schemas & {shard}, st.complete & {shard}, st.cached & {shard}), shard
