"""A column default that calls a function of its own schema without arguments (`shard_5.next_id()`) is named from
the catalog in what drift compares, not by pg_get_expr (whose look at every function of that name made the
fingerprint grow with the square of the shards); every other default goes to pg_get_expr. Either way the item
must read as pg_get_expr prints it, on every major (the node text the shortcut reads can differ between them)."""
from __future__ import annotations

import psycopg
import pytest

from pgidgen.config import Config
from pgidgen.ddl import drift
from pgidgen.init import init

PLAIN = "pg_catalog.pg_get_expr(d.adbin, d.adrelid)"

TABLE = """
CREATE FUNCTION shard_0."Odd Name"() RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION shard_0.plus(integer) RETURNS integer LANGUAGE sql AS $$ SELECT $1 + 1 $$;
CREATE FUNCTION shard_0.seven() RETURNS integer LANGUAGE sql AS $$ SELECT 7 $$;
CREATE FUNCTION public.elsewhere() RETURNS bigint LANGUAGE sql AS $$ SELECT 1::bigint $$;
CREATE TABLE shard_0.d (
    own      bigint  DEFAULT shard_0.next_id(),
    quoted   text    DEFAULT shard_0."Odd Name"(),
    nested   bigint  DEFAULT shard_0.next_id() + 1,
    args     integer DEFAULT shard_0.plus(1),
    other    bigint  DEFAULT public.elsewhere(),
    cast_to  text    DEFAULT shard_0.next_id()::text,
    widened  bigint  DEFAULT shard_0.seven(),
    constant integer DEFAULT 3
);
"""


@pytest.mark.sensitive
def test_a_default_named_from_the_catalog_reads_as_pg_get_expr_prints_it(config: Config) -> None:
    assert all(o.ok for o in init(config, 1, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute(TABLE)
        assert drift._DEFAULT in drift.SCHEMA_ITEMS_SQL
        items = drift.schema_items(conn, "shard_0")
        printed = {str(r[0]) for r in conn.execute(drift.SCHEMA_ITEMS_SQL.replace(drift._DEFAULT, PLAIN), {"schema": "shard_0"})}
        assert items == printed
        columns = sorted(i for i in items if i.startswith("column d."))
        assert "column d.own bigint default shard_N.next_id()" in columns
        assert 'column d.quoted text default shard_N."Odd Name"()' in columns
        # which defaults the catalog named (the rest went to pg_get_expr)
        named = conn.execute(
            f"SELECT a.attname FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_class c ON c.oid = d.adrelid"
            f" JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
            f" WHERE c.oid = 'shard_0.d'::pg_catalog.regclass AND {drift._DEFAULT.replace(PLAIN, 'NULL')} IS NOT NULL ORDER BY 1").fetchall()
        assert [r[0] for r in named] == ["own", "quoted"]
