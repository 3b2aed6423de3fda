"""Least privilege: everything as a role that owns its database and has REPLICATION (and, on 16+, membership of
pg_create_subscription), logging in with scram-sha-256 — what managed services give; and `pgidgen check`
naming what is missing (wal_level, free slots, REPLICATION), which move-shard refuses before journaling.

Its DSNs carry no password: it comes from PGPASSWORD, as a secret from the environment would. The subscription
must carry it (PostgreSQL's password_required for non-superusers), and no output, log line or journal row may.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from click.testing import CliRunner, Result
from conftest import TestServer, fresh_database
from movekit import Writer, leftovers
from privkit import Grant, drop, least_privileged, names
from psycopg import sql

from pgidgen import pgbin, sandbox
from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.layout import Layout
from pgidgen.routing import Router

DDL = "CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id(), v int NOT NULL);\n"


class Owner:
    """Two databases on two servers owned by one least-privileged role, and a config naming them."""

    def __init__(self, servers: list[sandbox.Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grant: Grant | None = None) -> None:
        self.role, self.password, self.dbname = names()
        self.servers = servers
        self.dsns = {f"db{i + 1}": least_privileged(s, self.role, self.password, self.dbname, grant) for i, s in enumerate(servers)}
        monkeypatch.setenv("PGPASSWORD", self.password)
        self.path = tmp_path / "pgidgen.toml"
        write_config(self.path, Layout.make(), self.dsns)
        self.outputs: list[str] = []

    def cli(self, *args: str) -> Result:
        r = CliRunner().invoke(main, ["--config", str(self.path), *args])
        self.outputs.append(r.output)
        return r

    def major(self, name: str = "db1") -> int:
        with psycopg.connect(self.dsns[name]) as c:
            return c.info.server_version // 10000

    def moves(self) -> list[str]:
        with psycopg.connect(self.dsns["db1"]) as c:
            return [str(r[0]) for r in c.execute("SELECT m::text FROM pgidgen.moves m")]

    def assert_password_nowhere(self) -> None:
        for out in self.outputs:
            assert self.password not in out
        for s in self.servers:
            assert self.password not in Path(s.logfile).read_text(errors="replace"), f"{s.name}'s server log"
        assert not any(self.password in m for m in self.moves()), "the journal"

    def close(self) -> None:
        for s in self.servers:
            drop(s, self.dbname)


def _sandboxed(servers: list[TestServer]) -> list[sandbox.Server]:
    if any(s.server is None for s in servers):
        pytest.skip("needs the tests' own servers (their pg_hba.conf), not PGIDGEN_TEST_DSNS")
    return [s.server for s in servers if s.server is not None]


@pytest.fixture
def owner(pg_servers: list[TestServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Owner]:
    o = Owner(_sandboxed(pg_servers[:2]), tmp_path, monkeypatch)
    try:
        yield o
    finally:
        o.close()


def _fill(dsn: str, shard: int, rows: int = 200) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO shard_{shard}.t (v) SELECT g FROM generate_series(1, {rows}) g")


def _ids(dsn: str, shard: int) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {r[0] for r in c.execute(f"SELECT id FROM shard_{shard}.t")}


def _move_under_writer(o: Owner, shard: int, target: str, *extra: str) -> tuple[Result, Writer]:
    writer = Writer(o.dsns, shard)
    writer.start()
    time.sleep(0.3)
    r = o.cli("move-shard", str(shard), target, *extra)
    time.sleep(0.3)
    writer.stop()
    return r, writer


def _assert_moved(o: Owner, r: Result, writer: Writer, shard: int, before: set[int], target: str) -> None:
    assert r.exit_code == 0, r.output
    assert "moved shard" in r.output and "all match" in r.output, r.output
    ids = writer.ids
    assert ids and len(set(ids)) == len(ids) and ids == sorted(ids), "no duplicate, IDs only ever grew"
    assert _ids(o.dsns[target], shard) == before | set(ids), "nothing lost"


@pytest.mark.sensitive
def test_a_least_privileged_role_inits_applies_ddl_and_moves(owner: Owner, tmp_path: Path) -> None:
    o = owner
    major = o.major()
    ddl = tmp_path / "t.sql"
    ddl.write_text(DDL)
    r = o.cli("init", "--shards", "4", "--databases", "db1")
    assert r.exit_code == 0, r.output
    assert o.cli("apply-ddl", str(ddl)).exit_code == 0
    _fill(o.dsns["db1"], 1)
    before = _ids(o.dsns["db1"], 1)
    check = o.cli("check")
    if major >= 16:
        assert check.exit_code == 0, check.output
        assert f"db2: ok subscription: role {o.role} may create subscriptions (member of pg_create_subscription" in check.output
        assert "db2: ok reach db1: the server logs in to db1 as a subscription would" in check.output
        r, writer = _move_under_writer(o, 1, "db2")
        _assert_moved(o, r, writer, 1, before, "db2")
    else:
        assert check.exit_code == 1
        assert (f"db2: FAIL subscription: role {o.role} is not a superuser: on PostgreSQL 15 only a superuser may"
                " CREATE SUBSCRIPTION") in check.output, check.output
        r = o.cli("move-shard", "1", "db2")
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert "only a superuser may CREATE SUBSCRIPTION" in r.output and "--offline" in r.output, r.output
        assert o.moves() == [], "nothing journaled"
        # the least-privileged alternative: an offline move, under the same writer
        r, writer = _move_under_writer(o, 1, "db2", "--offline")
        _assert_moved(o, r, writer, 1, before, "db2")
    drift = o.cli("status", "--drift")
    assert drift.exit_code == 0, drift.output
    # the Router, as the same role: it reads the map (and LISTENs) on both databases, writes where the shard is now
    with Router.from_config(str(o.path)) as router:
        new_id = router.run(1, lambda c: c.execute("INSERT INTO shard_1.t (v) VALUES (-1) RETURNING id").fetchone()[0])
        assert router.run_for_id(new_id, lambda c: c.execute("SELECT v FROM shard_1.t WHERE id = %s", (new_id,)).fetchone()[0],
                                 read_only=True) == -1
    assert new_id in _ids(o.dsns["db2"], 1)
    assert leftovers(o.dsns) == []
    o.assert_password_nowhere()


def test_a_shard_object_of_a_role_the_movers_cannot_act_as_is_refused_before_anything_is_written(owner: Owner) -> None:
    """A table of the shard owned by another role (a migration role's, say): the source's role must read and lock it
    as its owner, the target's must create it owned by that role (ALTER ... OWNER TO needs SET on it). Each was
    found halfway: a "permission denied" database error to report, or a restore that failed after the slot and
    the publication existed, with a journaled move to roll back. Now one line each, before anything is written."""
    o = owner
    assert o.cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
    other = f"{o.role}_mig"
    admins = [f"host={s.datadir} port={s.port} user={sandbox.SUPERUSER} dbname={o.dbname}" for s in o.servers]
    for a in admins:
        with psycopg.connect(a, autocommit=True) as c:
            c.execute(f'CREATE ROLE "{other}"')
    try:
        with psycopg.connect(admins[0], autocommit=True) as c:
            c.execute("CREATE TABLE shard_1.t (id bigint PRIMARY KEY DEFAULT shard_1.next_id(), v int)")
            c.execute(f'ALTER TABLE shard_1.t OWNER TO "{other}"')
        def refused(problem: str, server: str) -> None:
            for extra in ((), ("--offline",), ("--dry-run",)):
                r = o.cli("move-shard", "1", "db2", *extra)
                assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
                assert problem in r.output, r.output
                assert f'GRANT "{other}" TO "{o.role}" on {server}\'s server' in r.output, r.output

        refused(f"role {o.role} cannot read and lock the objects of shard_1 owned by {other}", "db1")
        with psycopg.connect(admins[0], autocommit=True) as c:
            c.execute(f'GRANT "{other}" TO "{o.role}"')
        refused(f"role {o.role} cannot create the objects of shard_1 owned by {other}, as they are on db1", "db2")
        assert o.moves() == [] and leftovers(o.dsns) == []
        with psycopg.connect(o.dsns["db2"]) as c:
            assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'shard%'").fetchone() == (0,)
        o.assert_password_nowhere()
    finally:
        o.close()  # the databases first: the role owns a table in one
        for a in admins:
            with psycopg.connect(a.replace(f"dbname={o.dbname}", "dbname=postgres"), autocommit=True) as c:
                c.execute(f'DROP ROLE IF EXISTS "{other}"')


def test_check_names_a_role_without_replication(pg_servers: list[TestServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    o = Owner(_sandboxed(pg_servers[:2]), tmp_path, monkeypatch, Grant(replication=False))
    try:
        assert o.cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
        r = o.cli("check")
        assert r.exit_code == 1
        assert (f"db1: FAIL replication: role {o.role} lacks REPLICATION, which an online move out of this database needs:"
                f' ALTER ROLE "{o.role}" REPLICATION') in r.output, r.output
        r = o.cli("move-shard", "1", "db2")
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert f"role {o.role} lacks REPLICATION" in r.output and "(db1)" in r.output, r.output
        assert o.moves() == [], "nothing journaled"
        assert leftovers(o.dsns) == []
        o.assert_password_nowhere()
    finally:
        o.close()


@pytest.mark.sensitive
def test_checks_sql_for_a_role_with_capitals_is_quoted_and_works(pg_servers: list[TestServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands check suggests named the role unquoted: ALTER ROLE App_x REPLICATION folds to app_x (another role,
    or none)."""
    import sys

    role, password, dbname = names()
    monkeypatch.setattr(sys.modules[__name__], "names", lambda: ("App_" + role, password, dbname))
    o = Owner(_sandboxed(pg_servers[:1]), tmp_path, monkeypatch, Grant(replication=False, create_subscription=False))
    try:
        r = o.cli("check", "--no-reach")
        assert r.exit_code == 1
        hint = f'ALTER ROLE "{o.role}" REPLICATION'
        assert f"db1: FAIL replication: role {o.role} lacks REPLICATION, which an online move out of this database needs: {hint}" in r.output, r.output
        assert f'GRANT pg_create_subscription TO "{o.role}"' in r.output, r.output
        with psycopg.connect(pg_servers[0].dsn, autocommit=True) as c:
            c.execute(hint.encode())
        assert f"db1: ok replication: role {o.role} may replicate" in o.cli("check", "--no-reach").output
    finally:
        o.close()


@pytest.fixture(scope="module")
def replica_server() -> Iterator[sandbox.Server]:
    """A server with wal_level = replica, no replication slot and no replication origin for subscriptions
    (max_replication_slots = 0; on 18 also max_active_replication_origins = 0)."""
    root = sandbox.make_root()
    settings = {"wal_level": "replica", "max_replication_slots": "0"}
    if pgbin.server().major >= 18:
        settings["max_active_replication_origins"] = "0"
    server = sandbox.create_server(root, "walreplica", settings=settings)
    try:
        yield server
    finally:
        sandbox.destroy([server], root)


def test_check_names_wal_level_and_no_free_slot(replica_server: sandbox.Server, pg_servers: list[TestServer], tmp_path: Path) -> None:
    other = TestServer("db2", pg_servers[1].dsn, pg_servers[1].server)
    a, b = fresh_database(TestServer("db1", replica_server.dsn, replica_server)), fresh_database(other)
    try:
        dsns = {"db1": next(a), "db2": next(b)}
        path = tmp_path / "pgidgen.toml"
        write_config(path, Layout.make(), dsns)

        def cli(*args: str) -> Result:
            return CliRunner().invoke(main, ["--config", str(path), *args])

        assert cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
        r = cli("check")
        assert r.exit_code == 1
        assert "db1: FAIL wal_level: wal_level = replica, an online move out of it needs logical: set wal_level = logical and restart" in r.output, r.output
        assert "db1: FAIL slots: 0 of max_replication_slots = 0 free: raise max_replication_slots" in r.output, r.output
        assert "db1: FAIL origins: 0 of max_" in r.output and "a subscription's apply worker needs one" in r.output, r.output
        assert "db2: ok wal_level: logical" in r.output
        r = cli("check", "--json")
        failed = {(f["database"], f["item"]) for f in __import__("json").loads(r.output)["findings"] if not f["ok"]}
        assert failed == {("db1", "wal_level"), ("db1", "slots"), ("db1", "origins")}, r.output
        for args in (["move-shard", "1", "db2"], ["rebalance"]):  # rebalance: once for the pair, before any move
            r = cli(*args)
            assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
            assert "wal_level = replica" in r.output and "--offline" in r.output, r.output
        with psycopg.connect(dsns["db1"]) as c:
            assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0, "nothing journaled"
        with psycopg.connect(dsns["db2"]) as c:
            assert c.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None, "nothing written on the target"
        assert cli("move-shard", "1", "db2", "--offline").exit_code == 0, "the alternative the error offers works"
    finally:
        a.close()
        b.close()


@pytest.mark.sensitive
def test_check_names_a_target_that_cannot_reach_the_source(pg_servers: list[TestServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subscription's login is tried from the target's server itself: here the source trusts pgidgen's DSN (no
    password) while the target's role is no superuser, so PostgreSQL refuses its subscription a passwordless
    login. pgidgen's own connections all work; `check` and move-shard name the problem, before journaling."""
    servers = _sandboxed(pg_servers[:2])
    o = Owner(servers, tmp_path, monkeypatch)
    a = fresh_database(pg_servers[0])
    try:
        if o.major("db2") < 16:
            pytest.skip("on 15 only a superuser may subscribe (the test above): there is no login to try")
        dsns = {"db1": next(a), "db2": o.dsns["db2"]}
        write_config(o.path, Layout.make(), dsns)
        o.dsns = dsns
        assert o.cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
        with psycopg.connect(dsns["db1"], autocommit=True) as c:  # owned by the target's role (else that is refused first)
            c.execute(sql.SQL("ALTER SCHEMA shard_1 OWNER TO {}").format(sql.Identifier(o.role)))
            for kind, name in c.execute("SELECT 'SEQUENCE', oid::regclass::text FROM pg_class WHERE relnamespace = 'shard_1'::regnamespace"
                                        " UNION ALL SELECT 'FUNCTION', oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'shard_1'::regnamespace").fetchall():
                c.execute(sql.SQL(f"ALTER {kind} {name} OWNER TO {{}}").format(sql.Identifier(o.role)))
        r = o.cli("check")
        assert r.exit_code == 1
        line = next((ln for ln in r.output.splitlines() if ln.startswith("db2: FAIL reach db1:")), "")
        assert "the server cannot log in to db1 as a subscription: the source lets role postgres in without asking for a password" in line, r.output
        assert "FAIL" not in r.output.replace(line, ""), r.output
        r = o.cli("move-shard", "1", "db2")
        assert r.exit_code == 1 and r.output.count("\n") == 1 and "cannot log in to db1 as a subscription" in r.output, r.output
        with psycopg.connect(dsns["db1"]) as c:
            assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0, "nothing journaled"
        assert leftovers(dsns) == []
    finally:
        a.close()
        o.close()


@pytest.mark.sensitive
def test_a_subscription_login_that_fails_is_refused_and_logs_no_password(owner: Owner, tmp_path: Path) -> None:
    """The probe's login fails at the source (a wrong password in --subscription-dsn, with quotes, a backslash and
    dollar signs in it): refused before journaling, and neither password is in either server's log."""
    o = owner
    if o.major("db2") < 16:
        pytest.skip("on 15 only a superuser may subscribe: the role never gets to try a login")
    assert o.cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
    wrong = "no'pe\\$x$ $pgidgen_00$ ;"
    params = psycopg.conninfo.conninfo_to_dict(o.dsns["db1"])
    dsn = psycopg.conninfo.make_conninfo(**params, password=wrong)
    r = o.cli("move-shard", "1", "db2", "--subscription-dsn", dsn)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "the server cannot log in to db1 as a subscription" in r.output and "password authentication failed" in r.output, r.output
    assert wrong not in r.output
    assert o.moves() == [] and leftovers(o.dsns) == []
    for s in o.servers:
        assert wrong not in Path(s.logfile).read_text(errors="replace"), f"{s.name}'s server log"
    o.assert_password_nowhere()


# -- across majors, as the least-privileged role -------------------------------------------------------


@pytest.fixture
def owner_16_18(pg_major_server: Callable[[int], TestServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Owner]:
    servers = [pg_major_server(16), pg_major_server(18)]
    for s in servers:
        with psycopg.connect(s.dsn, autocommit=True) as c:  # 16 starts subscriptions at most every 5 s otherwise
            c.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'")
            c.execute("SELECT pg_reload_conf()")
    o = Owner(_sandboxed(servers), tmp_path, monkeypatch)
    try:
        yield o
    finally:
        o.close()


@pytest.mark.versions
def test_least_privileged_moves_16_to_18_and_back(owner_16_18: Owner, tmp_path: Path) -> None:
    """scram-sha-256, no superuser: init and apply-ddl on 16, a move up to 18 under a writer, and back down."""
    o = owner_16_18
    assert (o.major("db1"), o.major("db2")) == (16, 18)
    ddl = tmp_path / "t.sql"
    ddl.write_text(DDL)
    assert o.cli("init", "--shards", "4", "--databases", "db1").exit_code == 0
    assert o.cli("apply-ddl", str(ddl)).exit_code == 0
    _fill(o.dsns["db1"], 2)
    before = _ids(o.dsns["db1"], 2)
    r, writer = _move_under_writer(o, 2, "db2")
    _assert_moved(o, r, writer, 2, before, "db2")
    before = _ids(o.dsns["db2"], 2)
    assert o.cli("move-shard", "--cleanup", "2").exit_code == 0
    r, writer = _move_under_writer(o, 2, "db1")
    _assert_moved(o, r, writer, 2, before, "db1")
    assert leftovers(o.dsns) == []
    o.assert_password_nowhere()


def test_rebalance_checks_room_for_the_moves_it_runs_at_once(pg_servers: list[TestServer], tmp_path: Path) -> None:
    """One free replication slot on the source, two targets, --parallel 2: refused before any move is journaled,
    with the --parallel that fits; --parallel 1 then moves."""
    root = sandbox.make_root()
    server = sandbox.create_server(root, "oneslot", settings={"max_replication_slots": "1"})
    a = fresh_database(TestServer("db1", server.dsn, server))
    b, c = fresh_database(pg_servers[1]), fresh_database(pg_servers[2])
    try:
        dsns = {"db1": next(a), "db2": next(b), "db3": next(c)}
        path = tmp_path / "pgidgen.toml"
        write_config(path, Layout.make(), dsns)

        def cli(*args: str) -> Result:
            return CliRunner().invoke(main, ["--config", str(path), *args])

        assert cli("init", "--shards", "6", "--databases", "db1").exit_code == 0
        r = cli("rebalance", "--parallel", "2", "--by", "count")
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert "database db1 has room for 1 of the 2 moves out of it that --parallel runs at once" in r.output, r.output
        assert "run with --parallel 1" in r.output
        with psycopg.connect(dsns["db1"]) as conn:
            assert conn.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0, "nothing journaled"
        r = cli("rebalance", "--parallel", "1", "--by", "count")
        assert r.exit_code == 0, r.output
        assert leftovers(dsns) == []
    finally:
        for gen in (a, b, c):
            gen.close()
        sandbox.destroy([server], root)


def test_check_names_a_role_without_temporary(config: Config, tmp_path: Path) -> None:
    """init probes the server's argument order with temporary objects (idgen.check_argument_order); on a database
    whose TEMPORARY was revoked from PUBLIC, check said 'ok init' for a role with CREATE alone, and init then failed
    (found by a review). check names the GRANT; with it, init works. Application roles need no TEMPORARY."""
    dbname = psycopg.conninfo.conninfo_to_dict(config.dsn("db1"))["dbname"]
    role = "pgidgen_check_notemp"
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {role}")
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {role}')
        c.execute(f'REVOKE TEMPORARY ON DATABASE "{dbname}" FROM PUBLIC')
    try:
        path = tmp_path / "notemp.toml"
        write_config(path, config.layout, {"db1": psycopg.conninfo.make_conninfo(config.dsn("db1"), user=role)})
        check = lambda: CliRunner().invoke(main, ["--config", str(path), "check", "--no-reach"])  # noqa: E731
        r = check()
        assert r.exit_code == 1
        assert (f"db1: FAIL init: role {role} may not create temporary objects in database {dbname} (init checks the server's"
                f' argument order with them): GRANT TEMPORARY ON DATABASE "{dbname}" TO "{role}" (or make {role} the'
                " database's owner)\n") in r.output, r.output
        assert CliRunner().invoke(main, ["--config", str(path), "init", "--shards", "2"]).exit_code == 1  # as check said
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute(f'REVOKE CREATE ON DATABASE "{dbname}" FROM {role}')
        assert (f"db1: FAIL init: role {role} may not create schemas or temporary objects in database {dbname} (init checks"
                f" the server's argument order with them): GRANT CREATE ON DATABASE \"{dbname}\" TO \"{role}\"; GRANT TEMPORARY"
                f' ON DATABASE "{dbname}" TO "{role}"') in check().output
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute(f'GRANT CREATE, TEMPORARY ON DATABASE "{dbname}" TO {role}')
        assert f"db1: ok init: role {role} may create schemas and temporary objects in {dbname}\n" in check().output
        r = CliRunner().invoke(main, ["--config", str(path), "init", "--shards", "2"])
        assert r.exit_code == 0, r.output
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE IF EXISTS {role}")
