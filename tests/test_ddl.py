"""apply-ddl beyond single statements: the ledger (no-op, changed files, replay for new shards, moves),
all-or-nothing across databases, drift, --sql, and refusals, against real servers."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.ddl import parse_file
from pgidgen.ddl.ledger import ledger_copy_sql
from pgidgen.init import init
from pgidgen.layout import Layout

SCHEMA = """CREATE TABLE photos (
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
"""
SHARDS = 6  # 0-1 on db1, 2-3 on db2, 4-5 on db3


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def query(config: Config, db: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(config.databases[db], autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall()


def execute(config: Config, db: str, sql: str) -> None:
    with psycopg.connect(config.databases[db], autocommit=True) as conn:
        conn.execute(sql.encode())


def applied_alike(config_file: Path, path: Path, text: str) -> None:
    """text written to path and applied to every shard: no drift yet."""
    path.write_text(text)
    assert cli(config_file, "apply-ddl", str(path)).exit_code == 0
    assert cli(config_file, "status", "--drift").exit_code == 0


def drifts_and_back(config: Config, config_file: Path, changes: list[tuple[str, str]]) -> None:
    """Each change made in shard 3 (db2) alone is reported as drift; undone, none is."""
    for change, undo in changes:
        execute(config, "db2", change)
        res = cli(config_file, "status", "--drift")
        assert res.exit_code == 1 and "DRIFT: shards 3 (db2) differ" in res.output, (change, res.output)
        execute(config, "db2", undo)
        res = cli(config_file, "status", "--drift")
        assert res.exit_code == 0, (undo, res.output)


def tables(config: Config, db: str, shard: int) -> list[str]:
    return [r[0] for r in query(config, db, "SELECT relname::text FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'r' ORDER BY 1", f"shard_{shard}")]


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.sql"
    path.write_text(SCHEMA, encoding="utf-8")
    return path


@pytest.fixture
def sharded(config: Config) -> Config:
    init(config, SHARDS)
    return config


def test_apply_then_again_is_a_no_op(sharded: Config, config_file: Path, schema_file: Path) -> None:
    first = cli(config_file, "apply-ddl", str(schema_file))
    assert first.exit_code == 0, first.output
    assert first.output.splitlines() == [
        "db1: applied schema.sql (#1) to 2 shards (0-1)",
        "db2: applied schema.sql (#1) to 2 shards (2-3)",
        "db3: applied schema.sql (#1) to 2 shards (4-5)",
    ]
    for db, shard in (("db1", 0), ("db2", 3), ("db3", 5)):
        assert tables(sharded, db, shard) == ["likes", "photos"]
    again = cli(config_file, "apply-ddl", str(schema_file))
    assert again.exit_code == 0, again.output
    sha = parse_file(SCHEMA, "schema.sql").sha256
    assert again.output.splitlines() == [
        "db1: up to date: 2 shards already have schema.sql (#1)",
        "db2: up to date: 2 shards already have schema.sql (#1)",
        "db3: up to date: 2 shards already have schema.sql (#1)",
        f"nothing to do: every shard already has schema.sql (#1, sha256 {sha[:12]})",
    ]
    assert query(sharded, "db2", "SELECT shard, position, sha256 FROM pgidgen.ddl_ledger ORDER BY shard") == [(2, 1, sha), (3, 1, sha)]
    assert query(sharded, "db2", "SELECT position, name, source FROM pgidgen.ddl_files") == [(1, "schema.sql", SCHEMA)]


def test_changed_file_is_refused_unless_asked(sharded: Config, config_file: Path, schema_file: Path) -> None:
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    old_sha = parse_file(SCHEMA, "schema.sql").sha256
    schema_file.write_text("-- photos and likes\n" + SCHEMA, encoding="utf-8")
    res = cli(config_file, "apply-ddl", str(schema_file))
    assert res.exit_code == 1
    assert res.output == (
        f"Error: schema.sql was applied before with other content (#1, sha256 {old_sha[:12]}; only comments or formatting differ): "
        "pgidgen never re-runs an edited file by itself: put the change into a new file, or pass --reapply-changed to run the whole "
        "new version on every shard (write it re-runnable: IF NOT EXISTS, OR REPLACE)\n"
    )
    rerunnable = SCHEMA.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS").replace("CREATE INDEX ON", "CREATE INDEX IF NOT EXISTS photos_user ON")
    rerunnable += "ALTER TABLE photos ADD COLUMN IF NOT EXISTS place text;\n"
    schema_file.write_text(rerunnable, encoding="utf-8")
    res = cli(config_file, "apply-ddl", str(schema_file))
    assert res.exit_code == 1 and "its SQL differs" in res.output
    res = cli(config_file, "apply-ddl", str(schema_file), "--reapply-changed")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == "db1: applied schema.sql (#2) to 2 shards (0-1)"
    assert query(sharded, "db3", "SELECT count(*) FROM pg_attribute WHERE attrelid = 'shard_5.photos'::regclass AND attname = 'place'") == [(1,)]
    assert query(sharded, "db3", "SELECT shard, position FROM pgidgen.ddl_ledger ORDER BY 1, 2") == [(4, 1), (4, 2), (5, 1), (5, 2)]


def test_new_shards_get_the_ledger_replayed(sharded: Config, config_file: Path, schema_file: Path, tmp_path: Path) -> None:
    """A shard init creates later (here: shard 5, whose creation is undone by hand) gets exactly the same DDL."""
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    second = tmp_path / "tags.sql"
    second.write_text("CREATE TABLE tags (photo_id bigint REFERENCES photos (id), tag text);\n", encoding="utf-8")
    assert cli(config_file, "apply-ddl", str(second)).exit_code == 0
    with psycopg.connect(sharded.databases["db3"], autocommit=True) as conn:
        conn.execute("DROP SCHEMA shard_5 CASCADE")
        conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = 5")
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = 5")
    outcomes = init(sharded, SHARDS)
    assert [o.summary for o in outcomes if o.changed] == ["created 1 shards (5), replayed 2 sharded DDL files on them"]
    assert tables(sharded, "db3", 5) == ["likes", "photos", "tags"]
    assert query(sharded, "db3", "SELECT position FROM pgidgen.ddl_ledger WHERE shard = 5 ORDER BY 1") == [(1,), (2,)]
    status = cli(config_file, "status", "--drift")
    assert status.exit_code == 0, status.output
    assert status.output.splitlines()[-1] == "ok: all 6 shards hold the same schema and the same DDL ledger"


def test_a_database_without_ledger_files_gets_them_with_new_shards(config: Config, config_file: Path, schema_file: Path) -> None:
    """init on db1-db2 first, DDL applied there; db3 joins later via shards whose init had failed."""
    init(config, 4, ["db1", "db2"])
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    with psycopg.connect(config.databases["db2"], autocommit=True) as conn:
        conn.execute("DROP SCHEMA shard_3 CASCADE")
        conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = 3")
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = 3")
    init(config, 4, ["db1", "db2", "db3"])  # spread puts shard 3 on db3 now
    assert tables(config, "db3", 3) == ["likes", "photos"]
    assert query(config, "db3", "SELECT position, name FROM pgidgen.ddl_files") == [(1, "schema.sql")]


def test_ledger_rows_travel_with_a_moved_shard(sharded: Config, schema_file: Path, config_file: Path) -> None:
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    with psycopg.connect(sharded.databases["db3"], autocommit=True) as conn:
        copy = ledger_copy_sql(conn, 5)
        rows = conn.execute("SELECT shard, position, sha256, applied_at FROM pgidgen.ddl_ledger WHERE shard = 5").fetchall()
    with psycopg.connect(sharded.databases["db1"], autocommit=True) as conn:
        conn.execute(copy.encode())
        conn.execute(copy.encode())  # idempotent
        assert conn.execute("SELECT shard, position, sha256, applied_at FROM pgidgen.ddl_ledger WHERE shard = 5").fetchall() == rows


def test_all_or_nothing_across_databases(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    for db in ("db1", "db2"):
        execute(sharded, db, "CREATE TABLE public.countries (code text PRIMARY KEY)")
    path = tmp_path / "addresses.sql"
    path.write_text("CREATE TABLE addresses (\n  id bigint PRIMARY KEY DEFAULT next_id(),\n  country text REFERENCES public.countries (code)\n);\n")
    res = cli(config_file, "apply-ddl", str(path))
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        "db1: rolled back because db3 failed",
        "db2: rolled back because db3 failed",
        "db3: failed, rolled back: database db3 failed in shard_4 at statement 1 (CREATE TABLE) of addresses.sql:1:1: "
        'relation "public.countries" does not exist [SQLSTATE 42P01]: nothing was applied anywhere (rolled back); '
        "fix the file, or the shards it does not fit",
        "Error: 1 of 3 databases failed (db3); the others are as reported above",  # db1, db2 rolled back with it
    ]
    for db, shard in (("db1", 0), ("db2", 2), ("db3", 4)):
        assert tables(sharded, db, shard) == []
        assert query(sharded, db, "SELECT count(*) FROM pgidgen.ddl_ledger") == [(0,)]


@pytest.mark.sensitive
def test_drift_names_what_differs(sharded: Config, config_file: Path, schema_file: Path) -> None:
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    with psycopg.connect(sharded.databases["db2"], autocommit=True) as conn:
        conn.execute("ALTER TABLE shard_3.photos DROP COLUMN caption")
        conn.execute("DROP INDEX shard_3.photos_user_id_id_idx")
        conn.execute("CREATE INDEX extra ON shard_3.likes (user_id)")
    with psycopg.connect(sharded.databases["db3"], autocommit=True) as conn:
        conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = 4")
    res = cli(config_file, "status", "--drift")
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert [line for line in lines if line.startswith("DRIFT")] == [
        "DRIFT: shards 3 (db2) differ from the 5 shards like shard 0: missing column photos.caption text; "
        "missing index CREATE INDEX photos_user_id_id_idx ON shard_N.photos USING btree (user_id, id); "
        "extra index CREATE INDEX extra ON shard_N.likes USING btree (user_id)",
        "DRIFT: shard 4 on db3 is behind: missing schema.sql (#1); run 'pgidgen apply-ddl schema.sql' again to catch it up",
    ]
    as_json = json.loads(cli(config_file, "status", "--drift", "--json").output)
    assert as_json["drift"]["fingerprints"] == 2 and as_json["drift"]["ok"] is False


def test_sql_prints_per_database_without_connecting(tmp_path: Path, schema_file: Path) -> None:
    config_file = tmp_path / "offline.toml"
    write_config(config_file, Layout.make(), {"db1": "postgresql://nobody@127.0.0.1:1/x", "db2": "postgresql://nobody@127.0.0.1:1/y"})
    res = cli(config_file, "apply-ddl", str(schema_file), "--sql", "--shards", "4")
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.startswith("-- ===== database db1 =====\nBEGIN;\n-- pgidgen apply-ddl schema.sql (#1): database db1\n")
    assert "SET LOCAL search_path = shard_1, pg_catalog, pg_temp;\nCREATE TABLE shard_1.photos (id bigint PRIMARY KEY DEFAULT shard_1.next_id()," in out
    assert "REFERENCES shard_3.photos (id) ON DELETE CASCADE" in out
    assert "INSERT INTO pgidgen.ddl_ledger (shard, position, sha256) VALUES\n(0, 1, '" in out
    assert "shard_2" not in out.split("-- ===== database db2 =====")[0]
    assert out.rstrip().endswith("COMMIT;")
    res = cli(config_file, "apply-ddl", str(schema_file), "--sql")
    assert res.output == "Error: --sql needs --shards N: --sql does not connect, so it renders for shards spread as init --shards N spreads them\n"


def test_sql_commits_where_commit_every_would(sharded: Config, config_file: Path, schema_file: Path) -> None:
    """--sql --commit-every N prints the COMMITs a live run makes: run as printed, each shard is its own transaction."""
    res = cli(config_file, "apply-ddl", str(schema_file), "--sql", "--shards", str(SHARDS), "--commit-every", "1")
    assert res.exit_code == 0, res.output
    for part in res.output.split("-- ===== database ")[1:]:
        db, _, sql = part.partition(" =====\n")
        execute(sharded, db, sql)
    for db, shard in (("db1", 0), ("db2", 3), ("db3", 5)):
        assert tables(sharded, db, shard) == ["likes", "photos"]
        assert query(sharded, db, "SELECT count(DISTINCT xmin::text), count(*) FROM pgidgen.ddl_ledger") == [(2, 2)]
    assert cli(config_file, "apply-ddl", str(schema_file)).output.splitlines()[0] == "db1: up to date: 2 shards already have schema.sql (#1)"
    assert cli(config_file, "apply-ddl", str(schema_file), "--sql", "--shards", "2", "--commit-every", "0").output == (
        "Error: --commit-every must be at least 1: give the number of shards per transaction, e.g. 200\n"
    )


def test_every_database_must_be_reachable(sharded: Config, tmp_path: Path, schema_file: Path) -> None:
    config_file = tmp_path / "partial.toml"
    write_config(config_file, Layout.make(), {**sharded.databases, "db4": "postgresql://nobody@127.0.0.1:1/x"})
    res = cli(config_file, "apply-ddl", str(schema_file), "--databases", "db1")
    assert res.exit_code == 1
    assert res.output.startswith("Error: cannot connect to database db4 (127.0.0.1:1/x): ")
    assert res.output.endswith(
        ": nothing was applied: apply-ddl needs every configured database (the order of DDL files is global); start db4 or fix its"
        " connection string, and run it again (the ledger keeps what each shard has)\n"
    )
    assert tables(sharded, "db1", 0) == []


def test_a_role_without_rights_on_the_shards_is_told_so(sharded: Config, tmp_path: Path, schema_file: Path) -> None:
    """A role that reads and writes the ledger but may not create in the shards: told whose rights it needs."""
    role = f"ddl_weak_{uuid.uuid4().hex[:8]}"
    try:
        for dsn in sharded.databases.values():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DO $$ BEGIN CREATE ROLE {} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$").format(sql.Identifier(role)))
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgidgen TO {r}; GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA pgidgen TO {r}").format(
                    r=sql.Identifier(role)))
        weak = tmp_path / "weak.toml"
        write_config(weak, Layout.make(), {db: make_conninfo(dsn, user=role) for db, dsn in sharded.databases.items()})
        res = cli(weak, "apply-ddl", str(schema_file), "--databases", "db2")
        assert res.exit_code == 1
        assert res.output.splitlines() == [
            "db2: failed, rolled back: database db2 failed in shard_2 at statement 1 (CREATE TABLE) of schema.sql:1:1: permission denied for "
            "schema shard_2 [SQLSTATE 42501]: nothing was applied anywhere (rolled back); the config's role for db2 lacks the rights to change "
            "the shards: run apply-ddl as the role that ran init (it owns the shards and pgidgen's catalog)",
            "Error: 1 of 1 databases failed (db2)",
        ]
        assert tables(sharded, "db2", 2) == [] and query(sharded, "db2", "SELECT count(*) FROM pgidgen.ddl_files") == [(0,)]
    finally:
        for dsn in sharded.databases.values():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        for dsn in sharded.databases.values():  # roles belong to the server, whichever the databases share
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_shards_being_moved_are_left_out(sharded: Config, config_file: Path, schema_file: Path) -> None:
    """A shard a move has in flight keeps its tables as the move copies them (tests/test_ddl_live.py moves one)."""
    execute(sharded, "db2", "UPDATE pgidgen.shards SET state = 'moving' WHERE shard = 3")
    res = cli(config_file, "apply-ddl", str(schema_file))
    assert res.exit_code == 0, res.output
    assert next(line for line in res.output.splitlines() if line.startswith("db2: ")) == (
        "db2: applied schema.sql (#1) to 1 shards (2); left out shards 3, being moved (the move copies them as they are): run apply-ddl"
        " again once it is done to catch them up")
    assert tables(sharded, "db2", 2) == ["likes", "photos"] and tables(sharded, "db2", 3) == []


def test_databases_option_and_json(sharded: Config, config_file: Path, schema_file: Path) -> None:
    res = cli(config_file, "apply-ddl", str(schema_file), "--databases", "db2", "--json")
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)
    assert 1 <= out.pop("transactions") <= 2  # transactions commit after 50 ms of holding their locks: on a slow machine, 2
    assert out == {"database": "db2", "ok": True, "changed": True, "summary": "applied schema.sql (#1) to 2 shards (2-3)", "applied": 2, "caught_up": 0}
    assert tables(sharded, "db1", 0) == [] and tables(sharded, "db2", 2) == ["likes", "photos"]
    res = cli(config_file, "status", "--drift")
    assert [line for line in res.output.splitlines() if line.startswith("DRIFT")] == [  # db2's 2 shards are not the odd ones
        "DRIFT: shards 0-1 on db1 are behind: missing schema.sql (#1); run 'pgidgen apply-ddl schema.sql' again to catch them up",
        "DRIFT: shards 4-5 on db3 are behind: missing schema.sql (#1); run 'pgidgen apply-ddl schema.sql' again to catch them up",
    ], res.output
    assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0
    assert tables(sharded, "db1", 0) == ["likes", "photos"]


def test_missing_file(config_file: Path, tmp_path: Path) -> None:
    res = cli(config_file, "apply-ddl", str(tmp_path / "nope.sql"))
    assert res.output == f"Error: file {tmp_path / 'nope.sql'} does not exist: give the path of a .sql file\n"


def test_a_byte_order_mark_is_skipped_and_a_nul_byte_refused(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "bom.sql"
    path.write_bytes(b"\xef\xbb\xbf" + SCHEMA.encode())
    res = cli(config_file, "apply-ddl", str(path), "--databases", "db1")
    assert res.exit_code == 0, res.output
    assert query(sharded, "db1", "SELECT source FROM pgidgen.ddl_files") == [(SCHEMA,)]
    path = tmp_path / "nul.sql"
    path.write_bytes(b"CREATE TABLE tags (tag text);\nCREATE TABLE a (x int);\x00\nCREATE TABLE b (y int);\n")
    res = cli(config_file, "apply-ddl", str(path))
    assert res.exit_code == 1
    assert res.output == ("Error: nul.sql holds a NUL byte (nul.sql:2:24): a SQL file is text: remove the NUL byte (a file saved as UTF-16 is"
                          " full of them: save it as UTF-8)\n")
    assert tables(sharded, "db2", 2) == [] and query(sharded, "db1", "SELECT count(*) FROM pgidgen.ddl_files") == [(1,)]


def test_commit_every_resumes_where_it_stopped(sharded: Config, config_file: Path, schema_file: Path) -> None:
    execute(sharded, "db2", "CREATE TABLE shard_3.likes (x int)")
    res = cli(config_file, "apply-ddl", str(schema_file), "--commit-every", "1")
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        "db1: applied schema.sql (#1) to 2 shards (0-1)",
        'db2: failed: database db2 failed in shard_3 at statement 3 (CREATE TABLE) of schema.sql:8:1: relation "likes" already exists [SQLSTATE 42P07]: '
        "shards 2 of db2 were committed before; the other databases went on: fix the cause and run apply-ddl again, "
        "it resumes where it stopped; `pgidgen status --drift` shows how those shards differ",
        "db3: applied schema.sql (#1) to 2 shards (4-5)",
        "Error: 1 of 3 databases failed (db2); the others are as reported above",
    ]
    assert tables(sharded, "db2", 2) == ["likes", "photos"] and tables(sharded, "db2", 3) == ["likes"]
    execute(sharded, "db2", "DROP TABLE shard_3.likes")
    res = cli(config_file, "apply-ddl", str(schema_file), "--commit-every", "1")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1] == "db2: applied schema.sql (#1) to 1 shards (3)"
    assert cli(config_file, "apply-ddl", str(schema_file), "--commit-every", "0").output == (
        "Error: --commit-every must be at least 1: give the number of shards per transaction, e.g. 200\n"
    )


def test_name_option_records_under_that_name(sharded: Config, config_file: Path, schema_file: Path) -> None:
    res = cli(config_file, "apply-ddl", str(schema_file), "--name", "001-photos", "--databases", "db1")
    assert res.output.splitlines() == ["db1: applied 001-photos (#1) to 2 shards (0-1)"]
    assert query(sharded, "db1", "SELECT name FROM pgidgen.ddl_files") == [("001-photos",)]
    assert cli(config_file, "apply-ddl", str(schema_file), "--name", " ").output == (
        "Error: --name ' ' is not a usable file name: give a short non-empty name, e.g. schema.sql\n"
    )
    assert cli(config_file, "apply-ddl", str(schema_file), "--shards", "6").output == (
        "Error: --shards is only used with --sql: apply-ddl applies to the shards the databases hold\n"
    )


def test_a_name_with_a_line_break_is_refused_not_run(sharded: Config, config_file: Path, schema_file: Path, tmp_path: Path) -> None:
    """The name goes into a -- comment of the SQL run on every shard (and printed by --sql): after a line break the
    rest of it ran as SQL on every shard."""
    res = cli(config_file, "apply-ddl", str(schema_file), "--name", "x\nCREATE TABLE injected (i int); --")
    assert (res.exit_code, res.output) == (1, "Error: --name 'x\\nCREATE TABLE injected (i int); --' holds a line break: give a name on one line, e.g. schema.sql\n")
    odd = tmp_path / "a\rCREATE TABLE injected (i int); --.sql"
    odd.write_text(SCHEMA, encoding="utf-8")
    res = cli(config_file, "apply-ddl", str(odd), "--databases", "db1")
    assert res.exit_code == 1 and res.output.startswith("Error: the file name 'a\\rCREATE") and res.output.count("\n") == 1, res.output
    for db in ("db1", "db2", "db3"):
        assert query(sharded, db, "SELECT count(*) FROM pg_class WHERE relname = 'injected'") == [(0,)]
        assert query(sharded, db, "SELECT count(*) FROM pgidgen.ddl_files") == [(0,)]


def test_waits_for_the_ddl_lock_then_says_who_holds_it(
    sharded: Config, config_file: Path, schema_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgidgen.ddl import applytx
    from pgidgen.ddl.ledger import DDL_LOCK
    from pgidgen.idgen import LOCK_CLASS

    monkeypatch.setattr(applytx, "LOCK_WAIT_S", 1)
    with psycopg.connect(sharded.databases["db2"], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, DDL_LOCK))
        res = cli(config_file, "apply-ddl", str(schema_file))
    assert res.output == (
        "Error: another pgidgen apply-ddl, init or move-shard is changing shards in database db2: wait for it to finish, then run again\n"
    )
    assert tables(sharded, "db1", 0) == []
    for _ in range(3):  # back to back: each run releases the lock before the next takes it
        assert cli(config_file, "apply-ddl", str(schema_file)).exit_code == 0


def test_apply_to_databases_never_initialised_is_refused(config_file: Path, schema_file: Path, config: Config) -> None:
    """It said "nothing to do: every shard already has" the file, exit 0, with no catalog anywhere (found by a
    review); nothing is written."""
    r = cli(config_file, "apply-ddl", str(schema_file))
    assert r.exit_code == 1
    assert r.output.strip().splitlines()[-1] == (
        f"Error: no pgidgen catalog in db1, db2, db3: there are no shards to apply {schema_file.name} to: run 'pgidgen init --shards N' first")
    for name in ("db1", "db2", "db3"):
        with psycopg.connect(config.dsn(name), autocommit=True) as c:
            assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None


@pytest.mark.parametrize("names", [("db1", "db2"), ("db1",)])  # threads, and the one-database path without them
def test_ctrl_c_during_commit_every_commits_no_more_batches(config: Config, config_file: Path, tmp_path: Path, names: tuple[str, ...]) -> None:
    """Ctrl-C while apply-ddl --commit-every runs on two databases: no batch commits after it, and the message says
    which databases had committed some of their work (it said everything was rolled back while every shard got
    the file; found by a review)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    init(config, 1200, ["db1", "db2"])
    ddl = tmp_path / "wide.sql"
    ddl.write_text("".join(f"CREATE TABLE t{i} (id bigint PRIMARY KEY DEFAULT next_id(), v text);\n" for i in range(4)))
    proc = subprocess.Popen([str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), "apply-ddl", str(ddl),
                             "--databases", ",".join(names), "--commit-every", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def tables(name: str) -> int:
        return query(config, name, "SELECT count(*) FROM pg_class WHERE relname = 't0' AND relkind = 'r'")[0][0]  # type: ignore[return-value]

    try:
        deadline = time.monotonic() + 120
        while any(tables(n) == 0 for n in names) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        at_signal = {n: tables(n) for n in names}
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, out + err
    assert err.strip().splitlines()[-1].startswith(f"Error: interrupted; {', '.join(names)} had committed (some of) its work already"), err
    after = {n: tables(n) for n in names}
    for n in names:
        assert after[n] - at_signal[n] <= 20, (at_signal, after)  # at most the batch that was committing then
        assert after[n] < 600, after


@pytest.mark.sensitive
def test_drift_sees_composite_types_sql_bodies_and_switches(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    """Drift a review found unseen: an attribute added to a composite type, a BEGIN ATOMIC function body (prosrc is
    empty for those), a disabled trigger, row level security, SECURITY DEFINER, a domain default, a column
    collation. Each is made in one shard only, then found; the shards made alike again report no drift."""
    applied_alike(
        config_file, tmp_path / "kinds.sql",
        "CREATE TYPE pair AS (a int, b int);\n"
        "CREATE DOMAIN positive AS int CHECK (VALUE > 0);\n"
        "CREATE TABLE notes (id bigint PRIMARY KEY DEFAULT next_id(), body text, n positive);\n"
        "CREATE FUNCTION note_count() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM notes; END;\n"
        "CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;\n"
        "CREATE TRIGGER notes_touch BEFORE INSERT ON notes FOR EACH ROW EXECUTE FUNCTION touch();\n"
    )
    changes = [
        ("ALTER TYPE shard_3.pair ADD ATTRIBUTE c int", "ALTER TYPE shard_3.pair DROP ATTRIBUTE c"),
        ("CREATE OR REPLACE FUNCTION shard_3.note_count() RETURNS bigint LANGUAGE sql SET search_path = shard_3, pg_catalog, pg_temp"
         " BEGIN ATOMIC SELECT 42::bigint; END", "original"),
        ("ALTER TABLE shard_3.notes DISABLE TRIGGER notes_touch", "ALTER TABLE shard_3.notes ENABLE TRIGGER notes_touch"),
        ("ALTER TABLE shard_3.notes ENABLE ROW LEVEL SECURITY", "ALTER TABLE shard_3.notes DISABLE ROW LEVEL SECURITY"),
        ("ALTER FUNCTION shard_3.touch() SECURITY DEFINER", "ALTER FUNCTION shard_3.touch() SECURITY INVOKER"),
        ("ALTER DOMAIN shard_3.positive SET DEFAULT 5", "ALTER DOMAIN shard_3.positive DROP DEFAULT"),
        ('ALTER TABLE shard_3.notes ALTER body TYPE text COLLATE "C"', 'ALTER TABLE shard_3.notes ALTER body TYPE text COLLATE "default"'),
    ]
    with psycopg.connect(sharded.databases["db2"], autocommit=True) as conn:
        original = conn.execute("SELECT pg_get_functiondef('shard_3.note_count'::regproc)").fetchone()[0]
    drifts_and_back(sharded, config_file, [(change, original if undo == "original" else undo) for change, undo in changes])


def test_a_failure_past_a_databases_first_shard_names_shard_and_statement(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    """Only a database's first shard runs statement by statement; the others run in batches, whose failure named
    only the batch's range (a review). The failing batch is run again shard by shard to name it."""
    first = tmp_path / "first.sql"
    first.write_text("CREATE TABLE marks (id bigint PRIMARY KEY DEFAULT next_id(), m int);\n")
    assert cli(config_file, "apply-ddl", str(first)).exit_code == 0
    execute(sharded, "db2", "ALTER TABLE shard_3.marks DROP COLUMN m")  # db2 holds shards 2-3: 3 runs in a batch
    second = tmp_path / "second.sql"
    second.write_text("CREATE TABLE notes (id bigint PRIMARY KEY DEFAULT next_id());\nCREATE INDEX ON marks (m);\n")
    res = cli(config_file, "apply-ddl", "--atomic", str(second))
    assert res.exit_code == 1
    assert ('db2: failed, rolled back: database db2 failed in shard_3 at statement 2 (CREATE INDEX) of second.sql:2:1:'
            ' column "m" does not exist') in res.output, res.output
    assert tables(sharded, "db2", 2) == tables(sharded, "db1", 0) == ["marks"]  # nothing of second.sql anywhere


def test_database_timeouts_do_not_break_the_all_or_nothing_commit(sharded: Config, config_file: Path, schema_file: Path) -> None:
    """A database's transaction waits idle for the others before the commit: with a database-level
    idle_in_transaction_session_timeout (a common safety net) it was cut, and the others committed without it
    (found by a review). pgidgen's sessions turn these timeouts off."""
    names = ("db1", "db2", "db3")
    for db in names:
        execute(sharded, db, "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = 1', current_database());"
                             " EXECUTE format('ALTER DATABASE %I SET statement_timeout = 1', current_database()); END$$")
    try:
        res = cli(config_file, "apply-ddl", str(schema_file))
        assert res.exit_code == 0, res.output
    finally:
        for db in names:
            with psycopg.connect(sharded.databases[db], autocommit=True, options="-c statement_timeout=0") as conn:
                conn.execute("DO $$BEGIN EXECUTE format('ALTER DATABASE %I RESET ALL', current_database()); END$$")
    for db, shard in (("db1", 0), ("db2", 2), ("db3", 5)):
        assert tables(sharded, db, shard) == ["likes", "photos"]


def test_drift_sees_function_results_and_domain_bases(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    """Drift a review found unseen: a function re-created in one shard with another result type (same body), a
    domain made NOT NULL, a domain over another base type (and procedures, which have no result type, stay seen).
    Each is made in one shard only, then found; the shards made alike again report no drift."""
    applied_alike(
        config_file, tmp_path / "results.sql",
        "CREATE DOMAIN positive AS int CHECK (VALUE > 0);\n"
        "CREATE DOMAIN code AS text;\n"
        "CREATE FUNCTION one() RETURNS int LANGUAGE plpgsql AS $$BEGIN RETURN 1; END$$;\n"
        "CREATE PROCEDURE nop() LANGUAGE plpgsql AS $$BEGIN NULL; END$$;\n"
    )
    fn = "CREATE FUNCTION shard_3.one() RETURNS {} LANGUAGE plpgsql SET search_path = shard_3, pg_catalog, pg_temp AS $$BEGIN RETURN 1; END$$"
    changes = [
        (f"DROP FUNCTION shard_3.one(); {fn.format('bigint')}", f"DROP FUNCTION shard_3.one(); {fn.format('int')}"),
        ("ALTER DOMAIN shard_3.positive SET NOT NULL", "ALTER DOMAIN shard_3.positive DROP NOT NULL"),
        ("DROP DOMAIN shard_3.code; CREATE DOMAIN shard_3.code AS varchar(3)", "DROP DOMAIN shard_3.code; CREATE DOMAIN shard_3.code AS text"),
        ("DROP PROCEDURE shard_3.nop()", "CREATE PROCEDURE shard_3.nop() LANGUAGE plpgsql SET search_path = shard_3, pg_catalog, pg_temp AS $$BEGIN NULL; END$$"),
    ]
    drifts_and_back(sharded, config_file, changes)


def test_drift_sees_persistence_identity_kind_and_partition_keys(sharded: Config, config_file: Path, tmp_path: Path) -> None:
    """Drift a review found unseen: a table made UNLOGGED in one shard (its rows lost on a crash), an identity
    column switched from ALWAYS to BY DEFAULT (explicit ids accepted there only), a partitioned table re-created
    with another partition key. Each is made in one shard only, then found; undone, no drift."""
    applied_alike(
        config_file, tmp_path / "tables.sql",
        "CREATE TABLE notes (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text);\n"
        "CREATE TABLE ev (id bigint, at int) PARTITION BY RANGE (at);\n"
    )
    changes = [
        ("ALTER TABLE shard_3.notes SET UNLOGGED", "ALTER TABLE shard_3.notes SET LOGGED"),
        ("ALTER TABLE shard_3.notes ALTER COLUMN id SET GENERATED BY DEFAULT", "ALTER TABLE shard_3.notes ALTER COLUMN id SET GENERATED ALWAYS"),
        ("DROP TABLE shard_3.ev; CREATE TABLE shard_3.ev (id bigint, at int) PARTITION BY RANGE (id)",
         "DROP TABLE shard_3.ev; CREATE TABLE shard_3.ev (id bigint, at int) PARTITION BY RANGE (at)"),
    ]
    drifts_and_back(sharded, config_file, changes)


def test_a_database_down_is_waited_for_and_a_partial_apply_is_named_behind(config: Config, tmp_path: Path, schema_file: Path) -> None:
    """With db1 down apply-ddl advised removing it from the config; doing so applied the file to db2's shards only,
    and `status --drift` then described db2's up-to-date shards as the odd ones (issue 36): the error says to bring
    db1 back and run again, and drift names db1's shards behind by the ledger, whichever side has more shards."""
    init(config, 4, ["db1", "db2"])  # 0-1 on db1, 2-3 on db2 (two servers)
    both = {"db1": config.dsn("db1"), "db2": config.dsn("db2")}
    full, down, without = tmp_path / "full.toml", tmp_path / "down.toml", tmp_path / "without.toml"
    write_config(full, config.layout, both)
    write_config(down, config.layout, {**both, "db1": "postgresql://nobody@127.0.0.1:1/x"})
    write_config(without, config.layout, {"db2": both["db2"]})
    assert cli(full, "apply-ddl", str(schema_file)).exit_code == 0  # #1 everywhere
    photos = tmp_path / "more.sql"
    photos.write_text("CREATE TABLE tags (id bigint PRIMARY KEY DEFAULT next_id(), tag text NOT NULL);\n")
    res = cli(down, "apply-ddl", str(photos))
    assert res.exit_code == 1
    assert res.output.startswith("Error: cannot connect to database db1 (127.0.0.1:1/x): ")
    assert res.output.endswith(
        ": nothing was applied: apply-ddl needs every configured database (the order of DDL files is global); start db1 or fix its"
        " connection string, and run it again (the ledger keeps what each shard has)\n"
    ), res.output
    assert "remove" not in res.output and tables(config, "db2", 2) == ["likes", "photos"]
    assert cli(without, "apply-ddl", str(photos)).exit_code == 0  # taken out of the config all the same: #2 on db2 only
    res = cli(full, "status", "--drift")
    assert res.exit_code == 1
    assert [line for line in res.output.splitlines() if line.startswith("DRIFT")] == [
        "DRIFT: shards 0-1 on db1 are behind: missing more.sql (#2); run 'pgidgen apply-ddl more.sql' again to catch them up",
    ], res.output
    res = cli(full, "apply-ddl", str(photos))
    assert res.exit_code == 0 and res.output.splitlines()[0] == "db1: applied more.sql (#2) to 2 shards (0-1)", res.output
    assert cli(full, "status", "--drift").exit_code == 0
    assert tables(config, "db1", 0) == ["likes", "photos", "tags"]
