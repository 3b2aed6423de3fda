"""A set move's one schema dump (move/schemacache.py): cut by schema, it is what pg_dump prints of each schema
alone; a batch takes its part only while its schemas stand as they were dumped."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from movekit import leftovers
from moveshards import quick_subscription_start, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen.config import Config
from pgidgen.move import MoveOptions, batches, move_shards, schemacache
from pgidgen.move.transfer import COPY_SECTIONS, SchemaDump

APP = Path(__file__).parent / "schemas" / "app.sql"
RICH = ["shard_1", "shard_2", "shard_3"]


def _rich(dsn: str) -> None:
    """tests/schemas/app.sql built in each of RICH (its extensions in public, once)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.execute("SELECT 1 FROM pg_roles WHERE rolname = 'pgidgen_test_reader'").fetchone() is None:
            c.execute("CREATE ROLE pgidgen_test_reader")
        for line in APP.read_text().splitlines():
            if line.startswith("CREATE EXTENSION"):
                c.execute(line.replace(";", " SCHEMA public;").encode())
        for s in RICH:
            c.execute(f"CREATE SCHEMA {s}".encode())
            c.execute(f"SET search_path = {s}, public".encode())
            c.execute(APP.read_text().replace("public.", f"{s}.").replace("search_path = public", f"search_path = {s}, public").encode())


def test_a_schemas_objects_found_through_pg_depend_are_the_passes_over_the_catalogs(fresh_dsns: dict[str, str]) -> None:
    """depsql's dependents checks (what depends on a schema's objects) take the schema's functions, types (their
    arrays, relations' row types) and relations through pg_depend's index: every one the passes over pg_proc,
    pg_type and pg_class find, and no other."""
    from pgidgen.move import depsql

    dsn = fresh_dsns["db1"]
    _rich(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        for schema in RICH:
            found = {(str(r[0]), int(r[1])) for r in c.execute(f"SELECT c::text, o FROM ({depsql._objects_sql('%(s)s')}) x (c, o)", {"s": schema})}
            scanned = {(str(r[0]), int(r[1])) for r in c.execute(
                "SELECT 'pg_proc', oid FROM pg_proc WHERE pronamespace = %(s)s::regnamespace"
                " UNION ALL SELECT 'pg_type', oid FROM pg_type WHERE typnamespace = %(s)s::regnamespace"
                " UNION ALL SELECT 'pg_class', oid FROM pg_class WHERE relnamespace = %(s)s::regnamespace", {"s": schema})}
            assert found == scanned, (schema, sorted(found ^ scanned))
            assert len(scanned) > 100


def test_a_batch_reads_its_owners_grants_as_each_schema_does(fresh_dsns: dict[str, str]) -> None:
    """depsql.OWNER_GRANTS_MANY_SQL (a batch's schemas' objects through pg_depend's index) finds what
    OWNER_GRANTS_SQL's pass over the catalogs finds schema by schema, every kind of object app.sql grants on and
    more granted here, but for array types (their privileges are their element type's: none of their own to carry)."""
    from pgidgen.move import depsql

    dsn = fresh_dsns["db1"]
    _rich(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("GRANT USAGE ON TYPE shard_2.task_state, shard_2.money_pair, shard_2.hours TO pg_monitor;"
                  " GRANT USAGE ON SEQUENCE shard_2.tasks_id_seq TO pg_monitor; GRANT UPDATE (title) ON shard_2.tasks TO pg_monitor;"
                  " REVOKE EXECUTE ON FUNCTION shard_2.concat_line(text, text) FROM PUBLIC")
        c.execute("SET search_path = ''")
        many = {tuple(r) for r in c.execute(depsql.OWNER_GRANTS_MANY_SQL, {"schemas": RICH})}
        each = {(s, *r) for s in RICH for r in c.execute(depsql.OWNER_GRANTS_SQL, {"schema": s})}
        arrays = {(str(r[0]), str(r[1])) for r in c.execute(
            "SELECT n.nspname, pg_catalog.quote_ident(t.typname) FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace"
            " WHERE n.nspname = ANY(%s) AND t.typsubscript = 'pg_catalog.array_subscript_handler'::pg_catalog.regproc", (RICH,))}
    assert arrays and many == {r for r in each if r[1] != "TYPE" or (r[0], r[2]) not in arrays}
    kinds = {(r[1], r[3] is not None) for r in many if r[0] == "shard_2" and r[4] == "pg_monitor"}
    assert kinds == {("TYPE", False), ("SEQUENCE", False), ("TABLE", True)}, kinds
    concat = {r[4] for r in many if (r[2] or "").startswith("shard_2.concat_line(")}
    assert concat and "PUBLIC" not in concat, concat  # found, its owner's EXECUTE only


def _plain(script: bytes) -> bytes:
    return re.sub(rb"\n\n+", b"\n\n", script)


def test_a_dump_cut_by_schema_is_what_pg_dump_prints_of_those_schemas(fresh_dsns: dict[str, str]) -> None:
    dsn = fresh_dsns["db1"]
    _rich(dsn)
    cache = schemacache.SchemaCache(dsn, [RICH])
    try:
        assert cache.parts[0].done.wait(60) and cache.parts[0].sections is not None, cache.parts[0].error
        for subset in (["shard_2"], ["shard_1", "shard_3"]):
            cut = schemacache.CachedDump(dsn, [(cache.parts[0], set(subset))], subset, encoding="UTF8")
            assert cut.served()
            alone = SchemaDump(dsn, subset, encoding="UTF8", sections=COPY_SECTIONS)
            try:
                for section in COPY_SECTIONS:
                    mine = cut.section(section)
                    assert _plain(mine) == _plain(alone.section(section)), (subset, section)
                    assert {s for s in RICH if f"{s}.".encode() in mine} == set(subset), (subset, section)
            finally:
                alone.close()
        assert b"CREATE TABLE shard_2.accounts" in schemacache.CachedDump(dsn, [(cache.parts[0], {"shard_2"})], ["shard_2"], encoding="UTF8").section("pre-data")
    finally:
        cache.close()


def test_the_fingerprint_follows_ddl_and_not_rows(fresh_dsns: dict[str, str]) -> None:
    dsn = fresh_dsns["db1"]
    _rich(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        before = schemacache.fingerprints(c, RICH)
        c.execute("INSERT INTO shard_1.accounts (email, name) VALUES ('a@b.c', 'a')")
        c.execute("VACUUM ANALYZE shard_1.accounts")
        assert schemacache.fingerprints(c, RICH) == before
        for ddl, schema in (("COMMENT ON TABLE shard_1.accounts IS 'changed'", "shard_1"), ("GRANT SELECT ON shard_2.accounts TO pgidgen_test_reader", "shard_2"),
                            ("ALTER TABLE shard_3.accounts ALTER COLUMN name SET DEFAULT 'x'", "shard_3"), ("ALTER SCHEMA shard_1 OWNER TO pgidgen_test_reader", "shard_1")):
            c.execute(ddl.encode())
            now = schemacache.fingerprints(c, RICH)
            assert [s for s in RICH if now[s] != before[s]] == [schema], ddl
            before = now


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], bool]]:
    """Each batch's take() of the cache: (its schemas, whether the cache served it), the cache's part awaited first
    (a batch does not wait for it: a test that wants the cache served makes sure it is read)."""
    taken: list[tuple[list[str], bool]] = []
    take = schemacache.SchemaCache.take

    def waiting_take(self: schemacache.SchemaCache, conn: psycopg.Connection[Any], schemas: list[str]) -> Any:
        for p in self.parts:
            if set(p.schemas) & set(schemas):
                p.done.wait(60)
        got = take(self, conn, schemas)
        taken.append((list(schemas), got is not None and got.served()))
        return got

    monkeypatch.setattr(schemacache.SchemaCache, "take", waiting_take)
    return taken


def test_a_later_batch_takes_its_schemas_from_the_set_moves_dump(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_shards(config, rows=20)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE INDEX tags_n ON shard_3.tags (n)")
        c.execute("CREATE VIEW shard_3.recent AS SELECT id, v FROM shard_3.t WHERE v > 10")
        c.execute("COMMENT ON TABLE shard_3.t IS 'the rows'")
    monkeypatch.setattr(batches, "PAUSE_PER_SHARD_S", 0.15)  # two shards a batch under --max-pause 1s
    taken = _recording(monkeypatch)
    reports = move_shards(config, [0, 1, 2, 3], "db3", options=MoveOptions(max_pause=1.0))
    assert [r.shards for r in reports] == [[0, 1], [2, 3]]
    assert taken == [(["shard_0", "shard_1"], False), (["shard_2", "shard_3"], True)]  # the first dumps its own while the cache reads the rest
    assert all(r.verification is not None and r.verification.ok for r in reports)
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT obj_description('shard_3.t'::regclass), to_regclass('shard_3.tags_n') IS NOT NULL,"
                         " to_regclass('shard_3.recent') IS NOT NULL").fetchone() == ("the rows", True, True)
    assert all(state_of(config.dsn("db3"), s) == ("active", f"shard_{s}") for s in range(4))
    assert leftovers(config.databases) == []


def test_a_schema_changed_after_the_dump_is_dumped_again_by_its_batch(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_shards(config, rows=20)
    monkeypatch.setattr(batches, "PAUSE_PER_SHARD_S", 0.15)
    taken = _recording(monkeypatch)

    def alter(point: str) -> None:
        if point == "cutover" and len(taken) == 1:  # the first batch's pause: the cache has read shards 2 and 3 by then
            for p in cache_parts:
                p.done.wait(60)
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute("ALTER TABLE shard_3.t ADD COLUMN extra int DEFAULT 7")

    cache_parts: list[Any] = []
    made = schemacache.cache_for

    def keep(*args: Any) -> Any:
        cache = made(*args)
        cache_parts.extend(cache.parts if cache is not None else [])
        return cache

    monkeypatch.setattr("pgidgen.move.engine.cache_for", keep)
    reports = move_shards(config, [0, 1, 2, 3], "db3", options=MoveOptions(max_pause=1.0), hook=alter)
    assert [r.shards for r in reports] == [[0, 1], [2, 3]] and cache_parts
    assert taken == [(["shard_0", "shard_1"], False), (["shard_2", "shard_3"], False)]
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT count(*), min(extra) FROM shard_3.t").fetchone() == (20, 7)
    assert leftovers(config.databases) == []


def test_relations_found_through_pg_depend_are_a_pass_over_pg_class(fresh_dsns: dict[str, str]) -> None:
    """sqltext.relations_of (a batch's catalog checks find their schemas' relations through pg_depend's index)
    finds every relation of the schemas a pass over pg_class finds, of every kind app.sql makes, and no other."""
    from pgidgen.move.sqltext import relations_of

    dsn = fresh_dsns["db1"]
    _rich(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TYPE shard_2.pair AS (a int, b text); CREATE TABLE shard_2.ided (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY)")
        n = "(SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = ANY(%(schemas)s))"
        found = c.execute(f"SELECT c.oid, c.relkind::text FROM ({relations_of(n, 'c.oid, c.relkind')}) c", {"schemas": RICH}).fetchall()
        scanned = c.execute("SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                            " WHERE n.nspname = ANY(%(schemas)s)", {"schemas": RICH}).fetchall()
    assert sorted(found) == sorted(scanned) and len(found) == len(set(found))
    assert {k for _, k in found} >= {"r", "p", "i", "I", "S", "v", "m", "c"}, {k for _, k in found}
