"""init against real servers: spread, idempotence, refusals that leave nothing half-written."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from pgidgen import pgbin
from pgidgen.catalog import read_state
from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.db import execute_script
from pgidgen.init import init, offline_plan, render_init, spread
from pgidgen.layout import Layout

pytestmark = pytest.mark.sensitive  # behaviour can differ between majors: runs on every one


def shards_in(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return sorted(read_state(conn).active)


def schemas_in(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname ~ '^(shard_|pgidgen)'")}


def test_spread_is_even_and_contiguous() -> None:
    got = spread(10, ["a", "b", "c"])
    assert got == {"a": [0, 1, 2, 3], "b": [4, 5, 6], "c": [7, 8, 9]}
    assert spread(1, ["a", "b"]) == {"a": [0], "b": []}


def test_init_spreads_and_is_idempotent(config: Config) -> None:
    names = ["db1", "db2"]
    out = init(config, 100, names)
    assert [(o.database, o.ok, o.changed) for o in out] == [("db1", True, True), ("db2", True, True)]
    assert out[0].summary == "catalog installed, created 50 shards (0-49)"
    assert shards_in(config.dsn("db1")) == list(range(50))
    assert shards_in(config.dsn("db2")) == list(range(50, 100))
    again = init(config, 100, names)
    assert [o.changed for o in again] == [False, False]
    assert again[0].summary == "unchanged (holds 50 shards: 0-49)"
    with psycopg.connect(config.dsn("db2")) as conn:
        ids = [conn.execute("SELECT shard_77.next_id()").fetchone()[0] for _ in range(3)]
        assert ids == sorted(ids) and len(set(ids)) == 3
        assert {conn.execute("SELECT pgidgen.shard_of(%s)", (i,)).fetchone()[0] for i in ids} == {77}


def test_shards_stay_where_they_are(config: Config) -> None:
    init(config, 10, ["db1"])
    out = init(config, 10, ["db1", "db2", "db3"])
    assert [o.changed for o in out] == [False, True, True]  # db2/db3 get a catalog, no shards
    assert shards_in(config.dsn("db1")) == list(range(10))
    assert shards_in(config.dsn("db2")) == []


def test_layout_change_refused(config: Config) -> None:
    init(config, 10, ["db1"])
    other = Config(layout=Layout.make(sequence_bits=12, shard_bits=11), databases=config.databases)
    with pytest.raises(Exception) as e:
        init(other, 10, ["db1"])
    assert "was initialised with a different layout" in str(e.value)
    with pytest.raises(Exception, match="was initialised with 10 shards, not 20"):
        init(config, 20, ["db1"])


def run_cli(config_file: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--config", str(config_file), *args], input=input)


def test_foreign_schema_refused_nothing_written(config: Config, config_file: Path) -> None:
    with psycopg.connect(config.dsn("db2"), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shard_7")
        conn.execute("CREATE TABLE shard_7.mine (x int)")
    r = run_cli(config_file, "init", "--shards", "10", "--databases", "db1,db2")
    assert r.exit_code == 1
    assert r.stderr == (
        "Error: database db2 already has a schema shard_7 that pgidgen did not create: "
        "rename or drop it; pgidgen never clobbers a schema it does not own\n"
    )
    assert schemas_in(config.dsn("db1")) == set()
    assert schemas_in(config.dsn("db2")) == {"shard_7"}


def test_foreign_pgidgen_schema_refused(config: Config, config_file: Path) -> None:
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA pgidgen")
    r = run_cli(config_file, "init", "--shards", "4", "--databases", "db1")
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: database db1 has a schema named pgidgen that pgidgen did not create")


def test_bad_numbers_and_names(config_file: Path) -> None:
    r = run_cli(config_file, "init", "--shards", "0")
    assert (r.exit_code, r.stderr) == (1, "Error: --shards must be at least 1, not 0: give the number of logical shards, e.g. --shards 2000\n")
    r = run_cli(config_file, "init", "--shards", "9000")
    assert r.exit_code == 1
    assert r.stderr == (
        "Error: 9000 shards do not fit in 13 shard bits (at most 8192): "
        "use fewer shards or raise shard_bits in [layout] before the first init\n"
    )
    r = run_cli(config_file, "init", "--shards", "10", "--databases", "db1,nope")
    assert r.exit_code == 1
    assert r.stderr == f"Error: unknown database 'nope' ({config_file}): configured databases are: db1, db2, db3\n"


def test_unreachable_server_names_database_not_password(tmp_path: Path, fresh_dsns: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEAD_DSN", "postgresql://app:topsecret@127.0.0.1:1/app")
    path = tmp_path / "pgidgen.toml"
    path.write_text(f'[databases]\ndb1 = "{fresh_dsns["db1"]}"\ndead = "${{DEAD_DSN}}"\n')
    r = CliRunner().invoke(main, ["--config", str(path), "init", "--shards", "4"])
    assert r.exit_code == 1
    assert "topsecret" not in r.output
    assert r.stderr.startswith("Error: cannot connect to database dead (127.0.0.1:1/app): ")
    assert r.stderr.rstrip().endswith("check that the server is running and the connection string in the config is right")
    assert len(r.stderr.strip().splitlines()) == 1
    assert schemas_in(fresh_dsns["db1"]) == set()


def test_sql_is_offline_and_runs_in_psql(tmp_path: Path, config: Config, layout: Layout) -> None:
    path = tmp_path / "offline.toml"
    write_config(path, layout, {"db1": "postgresql://nobody@127.0.0.1:1/x", "db2": "postgresql://nobody@127.0.0.1:1/y"})
    r = CliRunner().invoke(main, ["--config", str(path), "init", "--shards", "6", "--sql"])
    assert r.exit_code == 0, r.output
    assert r.output.count("-- ===== database ") == 2
    assert r.output.count("CREATE SCHEMA \"shard_") == 6
    per_db = render_init(offline_plan(config, 6, ["db1", "db2"]))
    script = tmp_path / "db1.sql"
    script.write_text("BEGIN;\n" + per_db["db1"] + "COMMIT;\n")
    subprocess.run([str(pgbin.newest_client("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", config.dsn("db1"), "-f", str(script)], check=True, capture_output=True)
    assert shards_in(config.dsn("db1")) == [0, 1, 2]
    # what psql made is what init makes: a later init sees nothing to do on db1
    out = init(config, 6, ["db1", "db2"])
    assert out[0].changed is False and out[1].summary == "catalog installed, created 3 shards (3-5)"



def test_sql_checks_the_argument_order_like_init(tmp_path: Path, config: Config) -> None:
    """init --sql starts with the probe init runs (next_id() needs in-order defaults); inverted, it stops psql."""
    from pgidgen import idgen

    per_db = render_init(offline_plan(config, 2, ["db1"]))
    assert per_db["db1"].startswith(idgen.ORDER_PROBE)
    inverted = per_db["db1"].replace("(b OPERATOR(pg_catalog.=) c)", "(b OPERATOR(pg_catalog.<>) c)")
    script = tmp_path / "inverted.sql"
    script.write_text("BEGIN;\n" + inverted + "COMMIT;\n")
    r = subprocess.run([str(pgbin.newest_client("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", config.dsn("db1"), "-f", str(script)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "pgidgen: this server evaluates function arguments out of order" in r.stderr
    assert shards_in(config.dsn("db1")) == []

def test_grant_on_existing_shards_narrows_older_grants(config: Config) -> None:
    """init --grant on a database whose shards exist: they get the grants too, and older, wider rights are taken
    back: USAGE on the offset (nextval on it), UPDATE on either sequence (setval) from a GRANT or from default
    privileges, write access to the catalog (a review found default privileges left the role able to setval)."""
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS pgidgen_old_app")
        conn.execute("CREATE ROLE pgidgen_old_app LOGIN")
        conn.execute("ALTER DEFAULT PRIVILEGES GRANT ALL ON SEQUENCES TO pgidgen_old_app")
        conn.execute("ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO pgidgen_old_app")
    try:
        init(config, 2, ["db1"])
        with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
            conn.execute("GRANT USAGE, SELECT, UPDATE ON SEQUENCE shard_1.pgidgen_offset TO pgidgen_old_app")
        outcomes = init(config, 2, ["db1"], grant_roles=["pgidgen_old_app"])
        assert all(o.ok for o in outcomes)
        with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
            for shard in (0, 1):
                for seq, rights in (("pgidgen_offset", (False, True, False)), ("pgidgen_counter", (True, True, False))):
                    assert conn.execute(f"SELECT has_sequence_privilege('pgidgen_old_app', 'shard_{shard}.{seq}', 'USAGE'),"
                                        f" has_sequence_privilege('pgidgen_old_app', 'shard_{shard}.{seq}', 'SELECT'),"
                                        f" has_sequence_privilege('pgidgen_old_app', 'shard_{shard}.{seq}', 'UPDATE')").fetchone() == rights, (shard, seq)
            assert conn.execute("SELECT has_table_privilege('pgidgen_old_app', 'pgidgen.shards', 'UPDATE'),"
                                " has_table_privilege('pgidgen_old_app', 'pgidgen.shards', 'SELECT')").fetchone() == (False, True)
            conn.execute("SET ROLE pgidgen_old_app")
            assert conn.execute("SELECT pgidgen.shard_of(shard_1.next_id())").fetchone()[0] == 1
            conn.execute("RESET ROLE")
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
            conn.execute("DROP OWNED BY pgidgen_old_app")  # default privileges too
            conn.execute("DROP ROLE IF EXISTS pgidgen_old_app")


@contextmanager
def granted_role(config: Config, role: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection acting as a new login role that `init --grant` granted on db1 (2 shards); the role dropped after."""
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        init(config, 2, ["db1"], grant_roles=[role])
        with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
            conn.execute(f"SET ROLE {role}")
            yield conn
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")  # its grants too
            conn.execute(f"DROP ROLE {role}")


def test_grant_lets_a_role_use_shards(config: Config) -> None:
    with granted_role(config, "pgidgen_app_test") as conn:
        assert conn.execute("SELECT pgidgen.shard_of(shard_1.next_id())").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM pgidgen.shards").fetchone()[0] == 2
        # the slow path too (paced calls: the offset is raised to the clock), without UPDATE on the sequences
        ids = [conn.execute("SELECT shard_1.next_id() FROM pg_sleep(0.002)").fetchone()[0] for _ in range(5)]
        assert ids == sorted(ids) and len(set(ids)) == 5
        assert conn.execute("SELECT has_sequence_privilege('shard_1.pgidgen_offset', 'UPDATE')").fetchone()[0] is False
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT setval('shard_1.pgidgen_offset', 1)")
        # nor nextval on the offset: it would move it outside the generator lock (duplicates, or the offset back)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT nextval('shard_1.pgidgen_offset')")


def test_a_granted_role_reads_the_map_version_and_cannot_bump_it(config: Config) -> None:
    """Routers only read pgidgen.map_version (SELECT); --grant gave USAGE too, so an application role could
    nextval it and make every polling router reload the map (found by a review)."""
    from pgidgen.routing.mapcache import VERSION_SQL

    with granted_role(config, "pgidgen_app_mv") as conn:
        before = conn.execute(VERSION_SQL).fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT nextval('pgidgen.map_version')")
        assert conn.execute(VERSION_SQL).fetchone()[0] == before


def test_json_report_and_progress_quiet(config_file: Path) -> None:
    import json

    r = run_cli(config_file, "init", "--shards", "6", "--databases", "db1,db2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [d["database"] for d in data] == ["db1", "db2"] and all(d["ok"] for d in data)
    assert r.stderr == ""  # no progress bar when not a tty
    r = run_cli(config_file, "init", "--shards", "6", "--databases", "db1,db2")
    assert r.stdout.endswith("nothing to do: every shard already exists\n")


def test_a_server_that_evaluates_defaults_out_of_order_is_refused(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """next_id() relies on parameter defaults being evaluated in order; init probes each database first. A probe
    whose verdict is inverted stands in for a server that reorders them: init refuses and writes nothing."""
    from pgidgen import idgen

    assert "(b OPERATOR(pg_catalog.=) c)" in idgen.ORDER_PROBE
    monkeypatch.setattr(idgen, "ORDER_PROBE", idgen.ORDER_PROBE.replace(
        "(b OPERATOR(pg_catalog.=) c)", "(b OPERATOR(pg_catalog.<>) c)"))
    out = init(config, 4, ["db1"])
    assert [(o.ok, o.error) for o in out] == [(False, (
        "database db1 evaluates function arguments out of order, which next_id()'s fast path relies on: "
        "report the PostgreSQL version to pgidgen; nothing was installed"))]
    assert schemas_in(config.dsn("db1")) == set()


def test_ctrl_c_rolls_back_what_has_not_committed(config: Config, config_file: Path) -> None:
    """Ctrl-C while init runs on two databases in parallel: the running statements are cancelled and neither
    transaction commits afterwards (before, the worker threads ran on and committed everything while the message
    said it was rolled back; found by a review)."""
    import os
    import signal
    import sys
    import time

    proc = subprocess.Popen([str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), "init", "--shards", "6000",
                             "--databases", "db1,db2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        busy: set[str] = set()
        while busy != {"db1", "db2"} and time.monotonic() < deadline and proc.poll() is None:
            for name in ("db1", "db2"):
                with psycopg.connect(config.dsn(name), autocommit=True) as c:
                    if c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgidgen' AND state = 'active'"
                                 " AND datname = current_database()").fetchone()[0]:
                        busy.add(name)
            time.sleep(0.05)
        assert busy == {"db1", "db2"}, "init was not seen running on both databases"
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, out + err
    assert err.strip().splitlines() == ["Error: interrupted; every database's transaction was rolled back"], err
    for name in ("db1", "db2"):
        with psycopg.connect(config.dsn(name), autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'shard\\_%' OR nspname = 'pgidgen'").fetchone()[0] == 0


def test_an_epoch_in_the_future_is_refused(config: Config, tmp_path: Path) -> None:
    """Every ID made before it would decode to the epoch itself (found by a review); nothing is written."""
    import time
    from dataclasses import replace

    future = replace(config.layout, epoch_ms=int(time.time() * 1000) + 365 * 86_400_000)
    path = tmp_path / "future.toml"
    write_config(path, future, config.databases)
    for args in (["init", "--shards", "4"], ["init", "--shards", "4", "--sql"]):
        r = run_cli(path, *args)
        assert r.exit_code == 1 and "is in the future: every ID made before it would carry the epoch as its time" in r.output, r.output
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None


def test_a_layout_whose_time_field_has_run_out_is_refused(config: Config, tmp_path: Path) -> None:
    """An epoch of 1990 with 40 time bits ran out in 2024: init installed the shards and then every next_id()
    raised 'has used up its 40-bit time field' (found by a review). Refused, nothing written, --sql too."""
    from dataclasses import replace

    old = replace(config.layout, epoch_ms=631152000000)  # 1990-01-01T00:00:00Z: 40 bits last until 2024-11-03
    path = tmp_path / "old.toml"
    write_config(path, old, config.databases)
    for args in (["init", "--shards", "4"], ["init", "--shards", "4", "--sql"]):
        r = run_cli(path, *args)
        assert (r.exit_code, r.stdout) == (1, ""), r.output
        assert r.stderr == ("Error: the layout's time field ran out at 2024-11-03T19:53:47.776Z (epoch 1990-01-01T00:00:00.000Z,"
                            " 40 time bits): next_id() could make no ID: set [layout] epoch to a recent moment in the past"
                            " (the default is 2026-01-01T00:00:00Z)\n"), r.stderr
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None


def test_one_database_under_two_config_names_is_refused(config: Config, tmp_path: Path) -> None:
    """init half-wrote (the first name got its shards, the second failed) and map showed shards in both and in
    none (found by a review)."""
    path = tmp_path / "twice.toml"
    write_config(path, config.layout, {"dbA": config.dsn("db1"), "dbB": config.dsn("db1").replace("127.0.0.1", "localhost") + " options='-c TimeZone=Asia/Tokyo'"})
    r = run_cli(path, "init", "--shards", "8")
    assert r.exit_code == 1 and "dbA and dbB in the config are the same database" in r.output, r.output
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None
    init(config, 4, ["db1"])
    r = run_cli(path, "map")
    assert r.exit_code == 1 and "PROBLEM: dbA and dbB are the same database" in r.output, r.output
    assert "PROBLEM: shards 0-3 are active in more than one database: dbA, dbB" in r.output, r.output  # one line, not one per shard


def test_an_older_catalog_is_upgraded_by_init_and_by_a_move(config: Config, config_file: Path) -> None:
    """Fixes to the catalog's functions reach databases initialised before them (a review found an existing
    catalog kept claim_shard(NULL) returning NULL and min_id('infinity') raising)."""
    from pgidgen.idgen import CATALOG_REVISION
    from pgidgen.move import move_shard

    def make_old(name: str) -> None:
        with psycopg.connect(config.dsn(name), autocommit=True) as c:
            c.execute("COMMENT ON FUNCTION pgidgen.min_id(timestamptz) IS NULL")
            c.execute("ALTER FUNCTION pgidgen.claim_shard(integer, boolean) STRICT")
            c.execute("CREATE OR REPLACE FUNCTION pgidgen.min_id(ts timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT"
                      " AS $$ SELECT floor(extract(epoch FROM ts) * 1000)::bigint $$")

    def is_current(name: str) -> bool:
        with psycopg.connect(config.dsn(name), autocommit=True) as c:
            try:
                c.execute("SELECT pgidgen.claim_shard(NULL)")
                return False
            except psycopg.errors.NullValueNotAllowed:
                return c.execute("SELECT pgidgen.min_id('infinity')").fetchone()[0] == 2**63 - 1

    init(config, 4, ["db1", "db2"])
    make_old("db1")
    make_old("db2")
    assert not is_current("db1")
    r = run_cli(config_file, "init", "--shards", "4", "--databases", "db1,db2")
    assert r.exit_code == 0, r.output
    assert f"db1: catalog upgraded to revision {CATALOG_REVISION}, created 0 shards (none)" in r.output, r.output
    assert is_current("db1") and is_current("db2")
    r = run_cli(config_file, "init", "--shards", "4", "--databases", "db1,db2")
    assert "upgraded" not in r.output and "unchanged" in r.output, r.output
    make_old("db2")
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_3.t (id bigint PRIMARY KEY DEFAULT shard_3.next_id())")
    move_shard(config, 3, "db1")  # the source's catalog is brought up to date first
    assert is_current("db2")


def test_grant_to_the_role_that_owns_the_objects_is_refused(config: Config) -> None:
    """Its own rights would be revoked first: next_id()'s slow path (UPDATE on the offset) and apply-ddl would
    stop working for it. Refused before anything is written."""
    from pgidgen.errors import ConfigError

    with psycopg.connect(config.dsn("db1")) as conn:
        me = conn.execute("SELECT current_user").fetchone()[0]
    with pytest.raises(ConfigError, match=f"--grant {me}: {me} owns pgidgen's objects on database db1"):
        init(config, 4, ["db1"], grant_roles=[me])
    assert schemas_in(config.dsn("db1")) == set()
    init(config, 4, ["db1"])
    with pytest.raises(ConfigError, match="has every right on them already"):
        init(config, 4, ["db1"], grant_roles=["pg_monitor", me])
    with psycopg.connect(config.dsn("db1")) as conn:
        assert conn.execute("SELECT has_sequence_privilege(%s, 'shard_1.pgidgen_offset', 'UPDATE')", (me,)).fetchone()[0]


def test_two_inits_on_different_databases_at_once_create_each_shard_once(config: Config) -> None:
    """Each init plans from every configured database; run at the same moment, both used to find no shard
    anywhere and make all of them (two generators per shard: duplicate IDs). They now take turns."""
    import threading

    results: dict[str, object] = {}
    go = threading.Barrier(2)

    def run(name: str) -> None:
        go.wait()
        results[name] = init(config, 40, [name])

    threads = [threading.Thread(target=run, args=(n,)) for n in ("db1", "db2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(results) == {"db1", "db2"}
    one, two = shards_in(config.dsn("db1")), shards_in(config.dsn("db2"))
    assert sorted(one + two) == list(range(40)), (one, two)
    assert {len(one), len(two)} == {0, 40}  # whoever came second found every shard made


def test_an_init_running_elsewhere_is_waited_for_then_named(config: Config) -> None:
    from pgidgen.errors import ConflictError
    from pgidgen.idgen import INIT_RUN_LOCK, LOCK_CLASS
    from pgidgen.init import one_init_at_a_time

    with psycopg.connect(config.dsn("db2"), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, INIT_RUN_LOCK))
        with pytest.raises(ConflictError, match="another pgidgen init is running on database db2"):
            with one_init_at_a_time(config, ["db1", "db2"], patience=0.5):
                pass
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:  # db1's lock was given back while waiting
            assert c.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, INIT_RUN_LOCK)).fetchone()[0]


def test_a_role_without_rights_on_the_catalog_gets_a_named_error_with_a_hint(config: Config, tmp_path: Path) -> None:
    """It used to be 'database error: permission denied for schema pgidgen: run again with --traceback to report
    it', naming no database (found by a review)."""
    init(config, 4, ["db1"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS pgidgen_nobody")
        c.execute("CREATE ROLE pgidgen_nobody LOGIN")
    try:
        path = tmp_path / "nobody.toml"
        write_config(path, config.layout, {"db1": psycopg.conninfo.make_conninfo(config.dsn("db1"), user="pgidgen_nobody")})
        for args in (["map"], ["init", "--shards", "4"], ["status", "--drift"]):
            r = run_cli(path, *args)
            assert r.exit_code == 1, r.output
            assert "database db1 failed while" in r.output and "permission denied" in r.output and "--traceback" not in r.output, r.output
            assert "connect as the role that ran init" in r.output, r.output
            assert args[0] != "init" or len(r.output.strip().splitlines()) == 1, r.output  # map and status list every database
        assert "db1: CANNOT READ: database db1 failed while reading from it: permission denied" in run_cli(path, "map").output
        r = run_cli(path, "move-shard", "1", "--cleanup")  # not "no database keeps a retired copy"
        assert r.exit_code == 1 and "no database pgidgen could read keeps a retired copy of shard 1 (db1): database db1 failed while" in r.output, r.output
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("DROP ROLE IF EXISTS pgidgen_nobody")


def test_a_role_that_may_not_create_temporary_objects_is_told_so(config: Config, tmp_path: Path) -> None:
    """init's check of the argument order uses temporary objects; on a database whose TEMPORARY privilege was
    revoked from PUBLIC (hardened setups do), a role with CREATE but not TEMPORARY got 'permission denied to create
    temporary tables' with the hint to connect as the role that ran init, on the very first init (found by a
    review). Nothing is written."""
    dbname = psycopg.conninfo.conninfo_to_dict(config.dsn("db1"))["dbname"]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS pgidgen_notemp")
        c.execute("CREATE ROLE pgidgen_notemp LOGIN")
        c.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO pgidgen_notemp')
        c.execute(f'REVOKE TEMPORARY ON DATABASE "{dbname}" FROM PUBLIC')
    try:
        path = tmp_path / "notemp.toml"
        write_config(path, config.layout, {"db1": psycopg.conninfo.make_conninfo(config.dsn("db1"), user="pgidgen_notemp")})
        r = run_cli(path, "init", "--shards", "2")
        assert r.exit_code == 1, r.output
        assert r.stdout == ("db1: failed, rolled back: database db1: pgidgen checks how the server evaluates function arguments with"
                            " temporary objects, and role pgidgen_notemp may not create them: GRANT TEMPORARY ON DATABASE"
                            f' "{dbname}" TO "pgidgen_notemp", or connect as the database\'s owner\n'), r.stdout
        assert schemas_in(config.dsn("db1")) == set()
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("DROP OWNED BY pgidgen_notemp")
            c.execute("DROP ROLE IF EXISTS pgidgen_notemp")


def test_init_without_the_database_a_shard_moved_to_names_it(config: Config, tmp_path: Path) -> None:
    """It failed on a duplicate key in pgidgen.shards (found by a review)."""
    from pgidgen.move import move_shard

    init(config, 4, ["db1", "db2"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.t (id bigint PRIMARY KEY DEFAULT shard_1.next_id())")
    move_shard(config, 1, "db3")
    path = tmp_path / "two.toml"
    write_config(path, config.layout, {"db1": config.dsn("db1"), "db2": config.dsn("db2")})
    r = run_cli(path, "init", "--shards", "4")
    assert r.exit_code == 1 and "shard 1 is retired in database db1 and active in no database of the config" in r.output, r.output
    r = run_cli(path, "map")
    assert r.exit_code == 1 and "shards in no database: 1" in r.output, r.output


def test_map_of_databases_never_initialised_is_not_ok(config_file: Path) -> None:
    r = run_cli(config_file, "map")
    assert r.exit_code == 1 and "PROBLEM: no database is initialised: run 'pgidgen init --shards N'" in r.output, r.output
    assert "ok: every shard" not in r.output


def test_a_service_file_keeps_its_options_and_pgidgen_its_session_settings(config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgidgen.db import connect

    params = psycopg.conninfo.conninfo_to_dict(config.dsn("db1"))
    lines = ["[s1]"] + [f"{k}={v}" for k, v in params.items()] + ["options=-c work_mem=77MB"]
    (tmp_path / "services.conf").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "services.conf"))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{params["dbname"]}" SET statement_timeout = 1234')
    conn = connect("db1", "service=s1", autocommit=True)
    try:
        assert conn.execute("SELECT current_setting('work_mem'), current_setting('statement_timeout')").fetchone() == ("77MB", "0")
    finally:
        conn.close()


def test_init_names_a_shard_whose_schema_was_dropped(config: Config, config_file: Path) -> None:
    """It said 'nothing to do' (found by a review)."""
    init(config, 4, ["db1"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP SCHEMA shard_2 CASCADE")
    r = run_cli(config_file, "init", "--shards", "4", "--databases", "db1")
    assert r.exit_code == 1 and "database db1 lists shard 2 in its catalog, but its schema is missing" in r.output, r.output


#: pgidgen.claim_shard as catalog revision 3 had it: a write claim locks the shard's row FOR SHARE.
CLAIM_REVISION_3 = """
CREATE OR REPLACE FUNCTION pgidgen.claim_shard(shard integer, for_write boolean DEFAULT true) RETURNS name
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE st text; s name;
BEGIN  -- (its NULL checks and messages left out)
    IF for_write THEN
        SELECT state, schema_name INTO st, s FROM pgidgen.shards WHERE shards.shard = claim_shard.shard FOR SHARE;
    ELSE
        SELECT state, schema_name INTO st, s FROM pgidgen.shards WHERE shards.shard = claim_shard.shard;
    END IF;
    IF st IS NULL OR st NOT IN ('active', 'moving') THEN RAISE EXCEPTION 'not served' USING ERRCODE = 'PGR01'; END IF;
    RETURN s;
END $$;
COMMENT ON FUNCTION pgidgen.min_id(timestamptz) IS 'pgidgen catalog revision 3';
"""


def test_a_revision_3_catalog_gets_the_advisory_claim(config: Config, config_file: Path) -> None:
    """claim_shard changed from a row lock to the advisory claim lock in revision 4: a database initialised before
    keeps its old claim (still safe: the cutover takes the row FOR UPDATE too) until init or a move brings it up."""
    from pgidgen.idgen import CATALOG_REVISION, CLAIM_LOCK_BASE, LOCK_CLASS

    init(config, 4, ["db1"])
    held = ("SELECT count(*) FILTER (WHERE locktype = 'advisory' AND classid = %s AND objid = %s),"
            " count(*) FILTER (WHERE locktype = 'transactionid') FROM pg_locks WHERE pid = pg_backend_pid()")
    key = (LOCK_CLASS, CLAIM_LOCK_BASE - 1 + 2**32)
    with psycopg.connect(config.dsn("db1")) as c:
        execute_script(c, CLAIM_REVISION_3)
        c.commit()
        c.execute("SELECT pgidgen.claim_shard(1)")
        assert c.execute(held, key).fetchone() == (0, 1)  # the old claim: a row lock, an XID
        c.rollback()
    r = run_cli(config_file, "init", "--shards", "4", "--databases", "db1")
    assert r.exit_code == 0 and f"db1: catalog upgraded to revision {CATALOG_REVISION}" in r.output, r.output
    with psycopg.connect(config.dsn("db1")) as c:
        c.execute("SELECT pgidgen.claim_shard(1)")
        assert c.execute(held, key).fetchone() == (1, 0)
