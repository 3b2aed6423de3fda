"""pgidgen import by a role with REPLICATION and SELECT only, once the tables' owner ran the SQL `--owner-sql`
prints (with psql, as an owner would): an import under the application's writes, its cutover through the owner's
gate, the preparation taken back; a rollback; a preparation made for another plan refused."""
from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from psycopg import sql
from test_import import SHARDS, _config_file, _killed_at, _rows, app_writer, source, two  # noqa: F401  (fixtures)

from pgidgen import pgbin
from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.errors import PgidgenError
from pgidgen.importing import plan_import, resume_import, rollback_import, start_import
from pgidgen.lockwait import LockPolicy, LockWaitExceeded

REFUSED = r"public\.(photos|users) was imported into pgidgen's shards \(16 shards on db1, db2; shard = user_id % 16\)"


@pytest.fixture
def reader(source: str) -> Iterator[str]:  # noqa: F811
    """The DSN of a role with REPLICATION, LOGIN and nothing else on the source (it owns nothing there)."""
    role = "imp_" + uuid.uuid4().hex[:8]
    with psycopg.connect(source, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        yield psycopg.conninfo.make_conninfo(source, user=role)
    finally:
        with psycopg.connect(source, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _owner_runs(source: str, text: str, tmp: Path) -> None:
    """The owner applies pgidgen's SQL as told: psql -v ON_ERROR_STOP=1 -f FILE."""
    path = tmp / f"owner-{uuid.uuid4().hex[:6]}.sql"
    path.write_text(text)
    psql = pgbin.clients().bindir / "psql"
    done = subprocess.run([str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", source, "-f", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _owner_sql(cfg: Config, reader: str, tmp: Path, *extra: str) -> str:
    result = CliRunner().invoke(main, ["--config", _config_file(cfg, tmp), "import", reader, "--key", "user_id", "--owner-sql", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def _prepare(cfg: Config, source: str, reader: str, tmp: Path) -> None:
    _owner_runs(source, _owner_sql(cfg, reader, tmp, "--skip", "countries"), tmp)


def test_a_role_with_replication_and_select_imports_once_the_owner_prepared(source: str, two: Config, reader: str,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    with psycopg.connect(source, autocommit=True) as c:  # an identity without the key, of an index: FULL for the import
        c.execute("ALTER TABLE photos REPLICA IDENTITY USING INDEX photos_pkey")
    with pytest.raises(PgidgenError, match=r"may not CREATE in its database.*pgidgen import --owner-sql"):
        plan_import(two, reader, schema="public", key="user_id", skip=["countries"])
    _prepare(two, source, reader, tmp_path)
    with psycopg.connect(reader) as c:  # what the import runs with: no table of the app's its own, no CREATE
        assert c.execute("SELECT count(*) FROM pg_class WHERE pg_has_role(relowner, 'USAGE') AND relnamespace = 'public'::regnamespace").fetchone() == (0,)
        assert c.execute("SELECT rolsuper, has_database_privilege(current_database(), 'CREATE') FROM pg_roles WHERE rolname = current_user").fetchone() == (False, False)
    w = app_writer(source)  # the application, as the tables' owner
    assert start_import(two, reader, schema="public", key="user_id", skip=["countries"], follow=True).step == "copied"
    early = psycopg.connect(source)
    early.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    early.execute("SELECT count(*) FROM users")  # its snapshot, taken before the cutover
    done = resume_import(two, reader, schema="public", cutover=True)
    w.finish()
    assert done.step == "done" and done.pause_s is not None and done.plan.prepared
    assert len(w.refused) == 1 and re.match(REFUSED, w.refused[0]), w.refused
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"public\.users was imported"):
        early.execute("UPDATE users SET name = 'late' WHERE user_id = 1")  # the gate is no snapshot's
    early.close()
    photos = _rows(two, "photos", "id, user_id")
    ids = [r[0] for _, r in photos]
    assert len(ids) == len(set(ids)) == 300 + len(w.acked) and {i for i, _ in w.acked} <= set(ids)
    assert all(shard == user % SHARDS for shard, (_, user) in photos)
    with psycopg.connect(source) as c:
        assert sorted(r for _, r in _rows(two, "users", "user_id, name")) == sorted(c.execute("SELECT user_id, name FROM users").fetchall())
    with psycopg.connect(two.databases["db1"]) as c:  # the shards have the source's schema, not the preparation's
        assert c.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'pgidgen_gate'").fetchone() == (0,)
        assert c.execute("SELECT relreplident, (SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'shard_3.photos'::regclass AND indisreplident)"
                         " FROM pg_class WHERE oid = 'shard_3.photos'::regclass").fetchone() == ("i", "shard_3.photos_pkey")
    assert sorted(leftovers({"source": source, **two.databases})) == [f"source: publication {done.plan.slot(n)}" for n in ("db1", "db2")]
    _owner_runs(source, _owner_sql(two, reader, tmp_path, "--rollback"), tmp_path)
    assert leftovers({"source": source, **two.databases}) == []
    with psycopg.connect(source, autocommit=True) as c:
        assert c.execute("SELECT relreplident FROM pg_class WHERE oid = 'public.photos'::regclass").fetchone() == ("i",)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"public\.photos was imported"):
            c.execute("DELETE FROM photos")


def test_a_prepared_import_waits_for_writers_rolls_back_and_the_owner_takes_it_back(source: str, two: Config, reader: str,  # noqa: F811
                                                                                      tmp_path: Path) -> None:
    path = _config_file(two, tmp_path)
    result = CliRunner().invoke(main, ["--config", path, "import", reader, "--owner-sql", "--rollback"])
    assert result.exit_code == 1 and "the source was not prepared for an import of schema public" in result.output, result.output
    _prepare(two, source, reader, tmp_path)
    with psycopg.connect(source, autocommit=True) as c:
        c.execute("CREATE SCHEMA s2; CREATE TABLE s2.t (user_id bigint PRIMARY KEY); ALTER TABLE logs ENABLE ROW LEVEL SECURITY")
    result = CliRunner().invoke(main, ["--config", path, "import", reader, "--key", "user_id", "--schema", "s2", "--owner-sql"])
    assert result.exit_code == 1 and "the source is prepared for an import of schema public, not s2" in result.output, result.output
    with pytest.raises(PgidgenError, match=r"table public\.logs has row-level security, and the import's role does not bypass it"):
        plan_import(two, reader, schema="public", key="user_id", skip=["countries"])  # it would copy no row of it
    with psycopg.connect(source, autocommit=True) as c:
        c.execute("ALTER TABLE logs DISABLE ROW LEVEL SECURITY")
    with pytest.raises(PgidgenError, match="the source was prepared for another import of schema public"):
        plan_import(two, reader, schema="public", key="user_id", skip=["countries", "logs"])  # not what the owner prepared
    assert start_import(two, reader, schema="public", key="user_id", skip=["countries"], follow=True).step == "copied"
    app = psycopg.connect(source)
    app.execute("INSERT INTO users VALUES (1000, 'open')")  # a transaction that wrote, still open: the cutover waits for it
    try:
        with pytest.raises(LockWaitExceeded, match=f"pid {app.info.backend_pid}"):
            resume_import(two, reader, schema="public", cutover=True, lock_policy=LockPolicy(lock_timeout=0.05, wait=0.5))
    finally:
        app.rollback()
        app.close()
    result = CliRunner().invoke(main, ["--config", path, "import", reader, "--rollback"])
    assert result.exit_code == 0, result.output
    assert "the tables' owner may take its preparation back" in result.output
    with psycopg.connect(source, autocommit=True) as c:  # the gate open again, nothing of the import's left but the owner's
        c.execute("INSERT INTO users VALUES (1001, 'after')")
        assert c.execute("SELECT count(*) FROM pgidgen_import.journal").fetchone() == (0,)
    assert sorted(leftovers({"source": source, **two.databases})) == [f"source: publication pgidgen_import_{_oid(source)}_{i}" for i in (0, 1)]
    assert sum(1 for _ in _rows(two, "users", "user_id")) == 0
    _owner_runs(source, _owner_sql(two, reader, tmp_path, "--rollback"), tmp_path)
    assert leftovers({"source": source, **two.databases}) == []
    with psycopg.connect(source) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen_import'), (SELECT count(*) FROM pg_trigger WHERE tgname = 'pgidgen_gate')").fetchone() == (None, 0)
        assert c.execute("SELECT relreplident FROM pg_class WHERE oid = 'public.photos'::regclass").fetchone() == ("d",)


@pytest.mark.parametrize("point", ["frozen:gate", "after:frozen"])
def test_a_prepared_import_killed_in_its_cutover(source: str, two: Config, reader: str, tmp_path: Path, point: str) -> None:  # noqa: F811
    """kill -9 with the gate shut: before the freeze committed (frozen:gate) the application's writes go on at once,
    nobody having to run anything (a setval is not undone with its transaction: they used to be refused until a
    --resume or --rollback); after it, they wait for --rollback, or are refused for good once --resume ends."""
    _prepare(two, source, reader, tmp_path)
    owner = psycopg.connect(source, autocommit=True)  # the application, as the tables' owner
    try:
        _killed_at(two, reader, point)
        if point == "after:frozen":
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"public\.users was imported"):
                owner.execute("INSERT INTO users VALUES (2000, 'frozen')")
            rollback_import(two, reader, schema="public")
            assert sum(1 for _ in _rows(two, "users", "user_id")) == 0
        owner.execute("INSERT INTO users VALUES (2001, 'serving')")
        if point == "after:frozen":
            _killed_at(two, reader, point)
        done = resume_import(two, reader, schema="public")
        assert done.step == "done" and done.plan.prepared
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"public\.users was imported"):
            owner.execute("INSERT INTO users VALUES (2002, 'late')")
        assert owner.execute("SELECT last_value FROM pgidgen_import.gate").fetchone() == (1,)  # shut for good
        assert sorted(r for _, r in _rows(two, "users", "user_id, name")) == sorted(owner.execute("SELECT user_id, name FROM users").fetchall())
        assert (2001, "serving") in [r for _, r in _rows(two, "users", "user_id, name")]
    finally:
        owner.close()
    _owner_runs(source, _owner_sql(two, reader, tmp_path, "--rollback"), tmp_path)
    assert leftovers({"source": source, **two.databases}) == []


def _oid(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
        assert row is not None
        return int(row[0])
