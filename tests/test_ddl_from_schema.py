"""apply-ddl --from-schema: a schema dump as the real tools write it, taken for every shard.

tests/schemas/app.sql is built in a scratch database's `public` on a real server and dumped with that server's own
pg_dump --schema-only (a Rails structure.sql too: --no-owner --no-privileges and Rails' schema_migrations
footer). The dumps go through the CLI to fleets on the same servers: every shard holds what `public` held (the
drift items of the original and of a shard compared), status --drift is clean, applying again is a no-op, the
app's own defaults (serial, identity, enums, triggers, partitions) work in a shard; a shard's pg_dump fed back
gives a fleet with the same fingerprint; a missing extension the role may not create is refused, nothing written.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from conftest import TestServer, fresh_database
from movekit import leftovers, writes_around
from privkit import drop, least_privileged, names
from psycopg import sql

from pgidgen import pgbin
from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.ddl.apply import read_file
from pgidgen.ddl.drift import FINGERPRINT_SQL, read_drift, schema_items
from pgidgen.ddl.dumpfile import parse_dump
from pgidgen.errors import InputError
from pgidgen.layout import Layout
from pgidgen.move import move_shard
from pgidgen.routing import Router

pytestmark = pytest.mark.sensitive  # pg_dump writes differently on every major

APP = Path(__file__).parent / "schemas" / "app.sql"
READER = "pgidgen_test_reader"
SHARDS = 6  # 0-1 on db1, 2-3 on db2, 4-5 on db3
RAILS_FOOTER = "SET search_path TO \"$user\", public;\n\nINSERT INTO \"schema_migrations\" (version) VALUES\n('20240101000000'),\n('20240312093000');\n\n\n"
#: relations, functions and types pgidgen's init puts in every shard
OWN = {"pgidgen_counter", "pgidgen_offset", "next_id", "pgidgen_locked_next_id"}


@dataclass
class Dumps:
    source: str  # the scratch database the app's schema was built in
    plain: Path  # pg_dump --schema-only
    rails: Path  # pg_dump --schema-only --no-owner --no-privileges, and Rails' footer
    pg_dump: Path
    major: int


def pg_dump_for(server: TestServer, major: int) -> Path:
    """The server's own pg_dump when its installation has one, else the newest (16 and 17 come without clients)."""
    if server.server is not None and (Path(server.server.bindir) / "pg_dump").is_file():
        return Path(server.server.bindir) / "pg_dump"
    return pgbin.clients_for(major).bindir / "pg_dump"


def dump(pg_dump: Path, dsn: str, *args: str) -> str:
    return subprocess.run([str(pg_dump), "--schema-only", *args, dsn], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def dumps(pg_servers: list[TestServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dumps]:
    for s in pg_servers:  # roles belong to the server: the dump grants to this one
        with psycopg.connect(s.dsn, autocommit=True) as c:
            if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (READER,)).fetchone() is None:
                c.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(READER)))
    made = fresh_database(pg_servers[0])
    source = next(made)
    with psycopg.connect(source, autocommit=True) as c:
        major = c.info.server_version // 10000
        c.execute(APP.read_bytes())
        if major >= 18:  # computed when read, never stored
            c.execute(b"ALTER TABLE projects ADD COLUMN title_length integer GENERATED ALWAYS AS (length(title)) VIRTUAL")
    tool = pg_dump_for(pg_servers[0], major)
    where = tmp_path_factory.mktemp("dumps")
    plain, rails = where / "structure.sql", where / "rails_structure.sql"
    plain.write_text(dump(tool, source))
    rails.write_text(dump(tool, source, "--no-owner", "--no-privileges") + RAILS_FOOTER)
    try:
        yield Dumps(source, plain, rails, tool, major)
    finally:
        next(made, None)


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def rows(dsn: str, query: str, *, first: str = "") -> list[tuple[object, ...]]:
    """The query's rows, after running `first` (statements) in the same session."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if first:
            c.execute(first.encode())
        return c.execute(query.encode()).fetchall()


_EXTENSION_MEMBERS = """
SELECT p.proname::text FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
UNION SELECT t.typname::text FROM pg_type t JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
"""


def items(dsn: str, schema: str) -> set[str]:
    """What status --drift compares, without the schema's own grants, the extensions' objects and init's: the
    schema's and the shard's names and a body's md5 (rewritten in the shard) made alike."""
    with psycopg.connect(dsn, autocommit=True) as c:
        found = schema_items(c, schema)
        members = {r[0] for r in c.execute(_EXTENSION_MEMBERS.encode())}
    out = set()
    for item in found:
        kind, _, rest = item.partition(" ")
        name = re.split(r"[ (]", rest, maxsplit=1)[0]
        if item.startswith("grants on schema ") or (kind in ("function", "type") and (name in members or name in OWN)):
            continue
        if kind in ("relation", "sequence", "grants") and name in OWN or item.startswith("grants on pgidgen_"):
            continue
        out.add(re.sub(r"[0-9a-f]{32}", "md5", re.sub(rf"\b(?:shard_N|{re.escape(schema)})\.", "", item)))
    return out


def counts(dsn: str, schema: str) -> tuple[object, ...]:
    """Tables, views, materialized views, sequences, indexes, functions (init's left out) of one schema."""
    return rows(dsn, f"""
        SELECT count(*) FILTER (WHERE relkind IN ('r', 'p')), count(*) FILTER (WHERE relkind = 'v'), count(*) FILTER (WHERE relkind = 'm'),
               count(*) FILTER (WHERE relkind = 'S' AND relname NOT LIKE 'pgidgen%'), count(*) FILTER (WHERE relkind IN ('i', 'I')),
               (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = '{schema}'::regnamespace AND p.proname NOT IN ('next_id', 'pgidgen_locked_next_id')
                AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'))
        FROM pg_class WHERE relnamespace = '{schema}'::regnamespace""")[0]


def test_a_dump_goes_into_every_shard(dumps: Dumps, config: Config, config_file: Path) -> None:
    assert cli(config_file, "init", "--shards", str(SHARDS)).exit_code == 0
    offline = cli(config_file, "apply-ddl", "--from-schema", "public", "--sql", "--shards", "2", "--owner", READER, str(dumps.plain))
    assert offline.exit_code == 0, offline.output
    assert offline.output.startswith("-- from schema public, taken for every shard: 21 tables, "), offline.output[:300]
    for text in ("SET LOCAL check_function_bodies TO 'false';", "CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA public;",
                 "CREATE TABLE shard_1.tasks (", f"ALTER TABLE shard_1.tasks OWNER TO {READER};", "RESET check_function_bodies;",
                 "nextval(CAST('shard_1.projects_id_seq' AS regclass))", "COLLATE shard_1.byte_order", "(title public.gin_trgm_ops)",
                 f"GRANT USAGE ON SCHEMA shard_1 TO {READER};"):
        assert text in offline.output, text

    r = cli(config_file, "apply-ddl", "--from-schema", "public", str(dumps.plain))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("from schema public, taken for every shard: 21 tables, 2 views, 1 materialized view, "), lines[0]
    assert lines[1].startswith("turned: 1 SET check_function_bodies into SET LOCAL while the shard's statements run; "), lines[1]
    assert "4 CREATE EXTENSION (checked in every database before anything runs; created where missing)" in lines[1]
    assert lines[2].startswith("left out: 2 psql \\restrict lines (pg_dump's guard for psql); "), lines[2]
    assert " OWNER TO (the shards' objects belong to the role pgidgen runs as; --owner ROLE names another)" in lines[2]
    assert lines[3:] == ["db1: applied structure.sql (#1) to 2 shards (0-1)", "db2: applied structure.sql (#1) to 2 shards (2-3)",
                         "db3: applied structure.sql (#1) to 2 shards (4-5)"]

    # every shard holds what public held: the same items as status --drift compares them
    original = items(dumps.source, "public")
    assert items(config.databases["db2"], "shard_3") == original
    want = counts(dumps.source, "public")
    assert want[:3] == (21, 2, 1), want
    for shard in range(SHARDS):
        assert counts(config.databases[f"db{shard // 2 + 1}"], f"shard_{shard}") == want, shard
    assert rows(config.databases["db1"], "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace") == [(0,)]
    drift = read_drift(config)
    assert drift.ok and drift.fingerprints == 1 and drift.shards == SHARDS, drift.problems
    again = cli(config_file, "apply-ddl", "--from-schema", "public", str(dumps.plain))
    assert again.exit_code == 0 and "nothing to do: every shard already has structure.sql (#1" in again.output, again.output

    # the app's own defaults, types, triggers, functions and partitions, in one shard
    got = rows(config.databases["db2"], first="""
        SET search_path = shard_3;
        INSERT INTO accounts (email, name) VALUES ('Ann@Example.org', 'ann');
        INSERT INTO projects (account_id, title, budget) VALUES (1, 'Roof tiles', ROW(12.50, 'EUR'));
        INSERT INTO tasks (project_id, title, during) VALUES (1, 'order tiles', '[2026-01-01, 2026-01-02)');
        INSERT INTO events (project_id, at, kind) VALUES (1, '2025-06-01', 'opened'), (1, '2031-01-01', 'later');
        INSERT INTO invoices (account_id, total) VALUES (1, ROW(30, 'EUR'));
        INSERT INTO labels (name) VALUES ('Urgent');
        INSERT INTO task_labels VALUES (1, 1);
        CALL close_project(1);
        REFRESH MATERIALIZED VIEW account_summary;
        RESET search_path;""", query="""
        SELECT (SELECT id FROM shard_3.accounts), (SELECT state::text FROM shard_3.tasks), (SELECT count(*) FROM shard_3.audit_log),
               (SELECT string_agg(tableoid::regclass::text, ',' ORDER BY at) FROM shard_3.events WHERE kind <> 'closed'),
               (SELECT count(*) FROM shard_3.events WHERE kind = 'closed'), (SELECT number FROM shard_3.invoices),
               (SELECT search::text FROM shard_3.projects), (SELECT label FROM shard_3.account_summary),
               'ROOF TILES ' OPERATOR(shard_3.~=) 'roof tiles', (SELECT email FROM shard_3.accounts) = 'ann@example.org',
               has_schema_privilege('pgidgen_test_reader', 'shard_3', 'USAGE')
    """)
    assert got == [(1, "done", 2, "shard_3.events_2025,shard_3.events_other", 1, 1000, "'roof':1 'tiles':2",
                    "ann <Ann@Example.org>", True, True, True)]


def test_a_shard_of_the_dump_moves_online_under_a_writer(dumps: Dumps, config: Config, config_file: Path) -> None:
    """Shard 0 of the app's schema (its own cast, an unlogged table, operator class, partitions, triggers, extension types) moves
    from db1 to db3 while an application writes to it through the Router: every acknowledged write is there, none
    failed, the move verified, nothing of the replication left; the shard's cast came along (a composite printed
    through it, not by the default cast), and the fleet's fingerprints still agree."""
    assert cli(config_file, "init", "--shards", str(SHARDS)).exit_code == 0
    assert cli(config_file, "apply-ddl", "--from-schema", "public", str(dumps.plain)).exit_code == 0
    rows(config.databases["db1"], "SELECT 1", first="""
        SET search_path = shard_0;
        INSERT INTO accounts (email, name) VALUES ('first@example.org', 'first');
        INSERT INTO projects (account_id, title, budget) VALUES (1, 'Roof tiles', ROW(12.50, 'EUR'));
        INSERT INTO events (project_id, at, kind) VALUES (1, '2025-06-01', 'opened'), (1, '2031-01-01', 'later');
        -- a trigger on the unlogged table: the copy in the pause must not fire it on the target (an audit row too many)
        CREATE FUNCTION note_session() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN INSERT INTO shard_0.audit_log (actor, action, detail) VALUES ('app', 'session', '{}'); RETURN NEW; END $$;
        CREATE TRIGGER sessions_noted AFTER INSERT ON sessions FOR EACH ROW EXECUTE FUNCTION note_session();
        RESET search_path;""")

    def work(c: psycopg.Connection[Any], n: int) -> int:
        (id_,) = c.execute("INSERT INTO accounts (email, name) VALUES (%s, %s) RETURNING id", (f"user{n}@example.org", f"user {n}")).fetchone() or (0,)
        c.execute("INSERT INTO sessions (token, account) VALUES (%s, %s)", (f"token {n}", id_))  # unlogged: not replicated
        return int(id_)

    def write(n: int) -> int:
        return router.run(0, lambda c: work(c, n))

    with Router(config, retry_for=30.0) as router:
        ids, errors, report = writes_around(write, lambda: move_shard(config, 0, "db3"), before=30, after=30)
    assert errors == [] and report.status == "done" and report.verification is not None and report.verification.ok, (errors, report.lines())
    moved = config.databases["db3"]
    assert rows(moved, "SELECT count(*), count(DISTINCT id) FROM shard_0.accounts WHERE id = ANY(%s)".replace("%s", f"ARRAY{ids}::bigint[]")) == [(len(ids), len(ids))]
    assert rows(moved, "SELECT budget::text, (SELECT count(*) FROM shard_0.events) FROM shard_0.projects") == [("12.50 EUR", 2)]
    assert rows(moved, f"SELECT count(*) FROM shard_0.sessions WHERE account = ANY(ARRAY{ids}::bigint[])") == [(len(ids),)]
    assert any(line.startswith("unlogged shard_0.sessions: ") and "rows copied in the pause" in line for line in report.lines()), report.lines()
    assert rows(moved, "SELECT count(*) FROM shard_0.audit_log WHERE action = 'session'") == [(len(ids),)]
    assert rows(moved, "SELECT tgenabled::text FROM pg_trigger WHERE tgname = 'sessions_noted'") == [("O",)]
    rows(moved, "SELECT 1", first="DROP TRIGGER sessions_noted ON shard_0.sessions; DROP FUNCTION shard_0.note_session()")  # the test's own
    assert leftovers(config.databases) == []
    drift = read_drift(config)
    assert drift.ok and drift.fingerprints == 1, drift.problems


def test_a_shard_dumped_and_fed_back_is_the_same_shard(dumps: Dumps, pg_servers: list[TestServer], config: Config, config_file: Path,
                                                      tmp_path: Path) -> None:
    assert cli(config_file, "init", "--shards", "4").exit_code == 0
    assert cli(config_file, "apply-ddl", "--from-schema", "public", str(dumps.plain)).exit_code == 0
    shard = tmp_path / "shard_0.sql"
    shard.write_text(dump(dumps.pg_dump, config.databases["db1"], "--schema=shard_0", "--clean", "--if-exists")  # drops first
                     # a cast has no schema: pg_dump --schema leaves it out, and its user writes it in (the fingerprint has it)
                     + "CREATE CAST (shard_0.money_pair AS text) WITH FUNCTION shard_0.money_pair_text(shard_0.money_pair);\n")
    made = [fresh_database(s) for s in pg_servers]
    try:
        fleet = {f"db{i + 1}": next(m) for i, m in enumerate(made)}
        for dsn in fleet.values():  # a dump of one schema holds no CREATE EXTENSION
            rows(dsn, "SELECT 1", first="CREATE EXTENSION citext; CREATE EXTENSION hstore; CREATE EXTENSION pg_trgm; CREATE EXTENSION btree_gist")
        second = tmp_path / "fleet2.toml"
        write_config(second, config.layout, fleet)
        assert cli(second, "init", "--shards", "4").exit_code == 0
        r = cli(second, "apply-ddl", "--from-schema", "shard_0", str(shard))
        assert r.exit_code == 0, r.output
        assert "pgidgen's own objects (init makes next_id() and its sequences in every shard)" in r.output, r.output
        assert "DROP and ALTER ... DROP of pg_dump --clean (the shards start without them: nothing to drop)" in r.output
        before = {s: fp for s, fp in rows(config.databases["db1"], FINGERPRINT_SQL)}
        after = {s: fp for d in fleet.values() for s, fp in rows(d, FINGERPRINT_SQL)}
        assert set(after.values()) == {before[0]}, (before, after)
    finally:
        for m in made:
            next(m, None)


def test_rails_structure_sql(dumps: Dumps, config: Config, config_file: Path) -> None:
    """Rails' dump: no owners, no grants, and its schema_migrations rows, recorded once (in the ledger's copy of
    the file) and not in the shards."""
    assert cli(config_file, "init", "--shards", "3").exit_code == 0
    r = cli(config_file, "apply-ddl", "--from-schema", "public", str(dumps.rails))
    assert r.exit_code == 0, r.output
    assert ("1 INSERT INTO schema_migrations (2 versions: Rails' record, kept once in the ledger's copy of the file, not in every shard)"
            in r.output), r.output
    assert "OWNER TO" not in r.output
    assert rows(config.databases["db2"], "SELECT count(*) FROM shard_1.schema_migrations") == [(0,)]
    (source,) = rows(config.databases["db3"], "SELECT source FROM pgidgen.ddl_files WHERE position = 1")[0]
    assert source == dumps.rails.read_text() and "('20240312093000')" in str(source)
    owner = cli(config_file, "apply-ddl", "--from-schema", "public", "--owner", READER, "--name", "again.sql", str(dumps.rails))
    assert owner.exit_code == 1
    assert owner.output == (f"Error: --owner {READER}: again.sql has no OWNER TO statements to turn (dumped with --no-owner,"
                            " as Rails does): leave --owner out (the shards' objects then belong to the role pgidgen runs as),"
                            " or dump with owners\n")


def test_an_extension_the_role_may_not_create_is_refused(pg_servers: list[TestServer], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    server = pg_servers[0].server
    if server is None:
        pytest.skip("needs the tests' own servers (their pg_hba.conf), not PGIDGEN_TEST_DSNS")
    made = fresh_database(pg_servers[0])
    source = next(made)
    role, password, dbname = names()
    try:
        with psycopg.connect(source, autocommit=True) as c:
            major = c.info.server_version // 10000
            c.execute(b"CREATE EXTENSION citext; CREATE EXTENSION pg_stat_statements;"
                      b" CREATE TABLE users (id bigint PRIMARY KEY, email citext NOT NULL UNIQUE)")
        file = tmp_path / "structure.sql"
        file.write_text(dump(pg_dump_for(pg_servers[0], major), source))
        dsn = least_privileged(server, role, password, dbname)
        monkeypatch.setenv("PGPASSWORD", password)
        config_file = tmp_path / "pgidgen.toml"
        write_config(config_file, Layout.make(), {"db1": dsn})
        assert cli(config_file, "init", "--shards", "2").exit_code == 0
        r = cli(config_file, "apply-ddl", "--from-schema", "public", str(file))
        assert r.exit_code == 1
        assert r.output.splitlines()[-1] == (
            "Error: database db1 lacks extension pg_stat_statements, and the config's role cannot create it: permission denied to"
            ' create extension "pg_stat_statements" [SQLSTATE 42501]: run CREATE EXTENSION IF NOT EXISTS pg_stat_statements WITH'
            " SCHEMA public; in database db1 as a role that may (a superuser; the database's owner for a trusted extension),"
            " or install the extension's package on that server; nothing was applied")
        assert rows(dsn, "SELECT (SELECT count(*) FROM pgidgen.ddl_files), (SELECT count(*) FROM pgidgen.ddl_ledger),"
                         " (SELECT count(*) FROM pg_class WHERE relnamespace = 'shard_0'::regnamespace AND relkind = 'r'),"
                         " (SELECT count(*) FROM pg_extension WHERE extname IN ('citext', 'pg_stat_statements'))") == [(0, 0, 0, 0)]
    finally:
        drop(server, dbname)
        next(made, None)


# -- what is refused, before any database is involved ------------------------------------------------------


@pytest.mark.parametrize(("text", "error"), [
    ("SET client_encoding = 'LATIN1';\nCREATE TABLE public.t (id int);\n",
     "statement 1 (SET) cannot be sharded: the dump is in encoding LATIN1 (d.sql:1:1): pgidgen reads UTF-8: dump with pg_dump --encoding=UTF8"),
    ("CREATE TABLE public.t (id int);\nCREATE TABLE other.t (id int);\n",
     "statement 2 (CREATE TABLE) cannot be sharded: it would change other.t once per shard (d.sql:2:1): a sharded file creates and changes"
     " objects inside the shards only; objects qualified with a schema may be referenced, not created or changed: manage them outside pgidgen"),
    ("CREATE TABLE public.t (id int);\nCOPY public.t (id) FROM stdin;\n",
     "statement 2 (COPY) cannot be sharded: it writes data (d.sql:2:1): give a schema-only dump (pg_dump --schema-only)"),
    ("\\connect app\nCREATE TABLE public.t (id int);\n",
     "d.sql holds a psql meta-command (\\connect app) (d.sql:1:1): give a plain-format dump of one database's schema: pg_dump"
     " --schema-only, without --create"),
    ("SET statement_timeout = 0;\nCREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA public;\n",
     "d.sql creates nothing in schema public (d.sql): give the dump of the database whose tables live in that schema (pg_dump"
     " --schema-only), and name the schema with --from-schema"),
    ("CREATE TABLE app.t (id int);\n",
     "d.sql creates nothing in schema public (its tables are in app) (d.sql): give the dump of the database whose tables live in that"
     " schema (pg_dump --schema-only), and name the schema with --from-schema"),
    ("CREATE TABLE public.t (id int);\nCREATE CAST (text AS public.citext) WITHOUT FUNCTION;\n",
     "statement 2 (CREATE CAST) cannot be sharded: it creates a cast between types that are not the shard's: it would be created once"
     " per shard (d.sql:2:1): a cast between types outside the shards belongs to the database: create it once per database outside pgidgen"),
])
def test_what_a_dump_cannot_bring(text: str, error: str) -> None:
    with pytest.raises(InputError) as e:
        parse_dump(text, "d.sql", "public")
    assert e.value.render() == error


def test_an_archive_is_not_sql(tmp_path: Path) -> None:
    archive = tmp_path / "app.dump"
    archive.write_bytes(b"PGDMP\x01\x10\x00\x04\x08\x01\x01\x01\xff")
    with pytest.raises(InputError) as e:
        read_file(archive, from_schema="public")
    assert e.value.render() == (f"file {archive} is a pg_dump archive (custom or tar format), not SQL: give it as SQL:"
                                f" pg_restore --schema-only --file structure.sql {archive} (or pg_dump --format=plain)")


def test_extensions_in_a_schema_of_their_own() -> None:
    """Heroku-style: the dump makes a schema for its extensions; it is made ahead of them, in the check too, and
    the shard's functions reach it after pg_catalog."""
    f = parse_dump("SELECT pg_catalog.set_config('search_path', '', false);\nCREATE SCHEMA heroku_ext;\n"
                   "CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA heroku_ext;\n"
                   "CREATE TABLE public.users (id bigint NOT NULL, email heroku_ext.citext);\n"
                   "CREATE FUNCTION public.norm(t text) RETURNS text LANGUAGE sql AS $$ SELECT lower(t)::citext::text $$;\n", "d.sql", "public")
    assert f.extensions == (("citext", "CREATE SCHEMA IF NOT EXISTS heroku_ext; CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA heroku_ext;"),)
    sql = f.for_shard(7)
    assert "CREATE TABLE shard_7.users (id bigint NOT NULL, email heroku_ext.citext);" in sql
    assert "SET search_path TO 'shard_7', 'pg_catalog', 'heroku_ext', 'pg_temp'" in sql
