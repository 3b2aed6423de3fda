"""pgidgen.integrations against real servers with the real libraries, each while `move-shard` moves the shard it
writes to: no exception reaches the application, nothing is lost, nothing is duplicated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from movekit import writes_around
from moveshards import quick_subscription_start  # noqa: F401 - a fixture: moves on PostgreSQL 15
from test_routing_pooler import app_config, bouncer_root  # noqa: F401 - bouncer_root is a fixture

from pgidgen import pgbouncer
from pgidgen.config import Config, load_config
from pgidgen.init import init
from pgidgen.move import move_shard

SHARDS = 4  # db1: 0-1, db2: 2-3, db3: none (the target)
SHARD = 1
HERE = Path(__file__).resolve().parent


@pytest.fixture
def sharded(config: Config) -> Config:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for shard in (0, 1):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), v int NOT NULL)")
        c.execute("INSERT INTO shard_1.t (v) SELECT g FROM generate_series(1, 50) g")
    return config


def move(config: Config) -> None:
    report = move_shard(config, SHARD, "db3")
    assert report.status == "done" and report.verification is not None and report.verification.ok


def assert_all_there(config: Config, ids: list[int], errors: list[str], *, before: int = 50) -> None:
    assert errors == []
    with psycopg.connect(config.dsn("db3")) as c:
        stored = [r[0] for r in c.execute("SELECT id FROM shard_1.t WHERE id = ANY(%s)", (ids,))]
        total = c.execute("SELECT count(*) FROM shard_1.t").fetchone()[0]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)  # nothing duplicated
    assert sorted(stored) == sorted(ids) and total == before + len(ids)  # nothing lost, nothing else


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_django_writer_during_a_move(through: str, sharded: Config, config_file: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("django")
    bouncer = None
    if through == "pgbouncer":  # the app's DSNs through PgBouncer in transaction mode (its mode not said)
        bouncer = pgbouncer.start(request.getfixturevalue("bouncer_root"), sharded.databases, mode="transaction")
        config_file = app_config(tmp_path, sharded, bouncer, None)
    env = {**os.environ, "PGIDGEN_CONFIG": str(config_file)}
    app = subprocess.Popen([sys.executable, str(HERE / "django_app.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert app.stdout is not None and app.stdin is not None
        line = app.stdout.readline()
        assert line == "ready\n", line + (app.stderr.read() if app.stderr else "")
        move(load_config(config_file))
        app.stdin.write("moved\n")
        app.stdin.flush()
        out, err = app.communicate(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
        if bouncer is not None:
            bouncer.stop()
    assert app.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    assert result["database"] == "db3"
    assert_all_there(sharded, result["ids"], result["errors"])


# -- SQLAlchemy -------------------------------------------------------------------------------------------

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import BigInteger, Integer, func, select, text  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: E402

from pgidgen.errors import RoutingError, ShardMovedError  # noqa: E402
from pgidgen.integrations.sqlalchemy import Sharding  # noqa: E402
from pgidgen.routing import Router  # noqa: E402


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "t"  # unqualified: schema_translate_map names the shard's schema
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=text("next_id()"))
    v: Mapped[int] = mapped_column(Integer)


def add(v: int) -> Any:
    def work(session: Any) -> int:
        row = Row(v=v)
        session.add(row)
        session.flush()  # INSERT ... RETURNING id: shard_N.next_id() made it
        return row.id

    return work


def test_sqlalchemy_session_routes_by_id_and_shard(sharded: Config) -> None:
    with Router(sharded, listen=False) as router:
        sharding = Sharding(router)
        try:
            first = sharding.run(SHARD, add(-1))
            assert router.shard_of(first) == SHARD
            with sharding.session(0) as session:  # another shard's session: a get by ID goes to the ID's shard
                assert session.get(Row, first).v == -1
                assert session.scalar(select(func.count()).select_from(Row)) == 0  # an unnamed query: its own shard
                assert session.execute(text("SELECT count(*) FROM t")).scalar() == 0  # text(): search_path
                session.rollback()
            with sharding.session() as session:
                session.add(Row(v=-2))
                with pytest.raises(RoutingError, match="no shard for objects without an ID"):
                    session.flush()
            assert sharding.run(SHARD, lambda s: s.scalar(select(func.count()).select_from(Row)), read_only=True) == 51
        finally:
            sharding.dispose()


def writes_during_a_move(config: Config, write: Callable[[int], int]) -> tuple[list[int], list[str]]:
    """write(n) in a loop in a thread, 50 writes before move-shard moves SHARD to db3 and 50 after it finished;
    the IDs written and every exception the loop saw."""
    ids, errors, _ = writes_around(write, lambda: move(config))
    return ids, [f"{type(e).__name__}: {e}" for e in errors]


def test_sqlalchemy_writer_during_a_move(sharded: Config) -> None:
    with Router(sharded) as router, Router(sharded, listen=False) as stale_router:
        sharding = Sharding(router)
        stale = Sharding(stale_router, pool_size=1)
        before = stale.session(SHARD)  # a long-lived session, whose router learns of the move only from PGR01
        with before.begin():
            before.add(Row(v=-1))
        try:
            ids, errors = writes_during_a_move(sharded, lambda n: sharding.run(SHARD, add(n)))
        finally:
            sharding.dispose()
        assert router.database_for(SHARD) == "db3"
        with pytest.raises(ShardMovedError, match="database db1 no longer serves shard 1"), before.begin():
            before.add(Row(v=-2))
            before.flush()
        with before.begin():  # the next transaction binds from the map read again
            row = Row(v=-3)
            before.add(row)
        before.close()
        stale.dispose()
    ids_all = [*ids, row.id]
    with psycopg.connect(sharded.dsn("db3")) as c:
        assert c.execute("SELECT v FROM shard_1.t WHERE id = %s", (row.id,)).fetchone() == (-3,)
        assert c.execute("SELECT count(*) FROM shard_1.t WHERE v IN (-1, -2)").fetchone() == (1,)  # -2 rolled back
    assert_all_there(sharded, ids_all, errors, before=51)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_sqlalchemy_writer_through_pgbouncer_during_a_move(mode: str, sharded: Config, bouncer_root: Path, tmp_path: Path) -> None:
    bouncer = pgbouncer.start(bouncer_root, sharded.databases, mode=mode)
    try:
        path = app_config(tmp_path, sharded, bouncer, None if mode == "transaction" else mode)  # the mode said or not
        with Router.from_config(str(path)) as router:
            sharding = Sharding(router)
            try:
                ids, errors = writes_during_a_move(load_config(path), lambda n: sharding.run(SHARD, add(n)))
            finally:
                sharding.dispose()
            assert router.database_for(SHARD) == "db3"
    finally:
        bouncer.stop()
    assert_all_there(sharded, ids, errors)


def test_sqlalchemy_refuses_to_claim_a_write_in_autocommit_mode(sharded: Config) -> None:
    """In AUTOCOMMIT mode every statement is a transaction of its own: the claim's lock would end with the claim,
    and the writes after it would not be held off a flip. Refused before anything is written."""
    with Router(sharded, listen=False) as router:
        sharding = Sharding(router, isolation_level="AUTOCOMMIT")
        try:
            with pytest.raises(RoutingError, match="AUTOCOMMIT mode, where the claim protects nothing"):
                sharding.run(SHARD, add(-3))
            assert sharding.run(SHARD, lambda s: s.scalar(select(func.count()).select_from(Row)), read_only=True) == 50
        finally:
            sharding.dispose()


def test_a_write_in_a_read_only_sqlalchemy_session_is_refused(sharded: Config) -> None:
    """A read-only session claims without the claim lock, so a write in it would not hold a move's flip off: the
    transaction is READ ONLY, as Router's read_only units are, and the write is refused, nothing written."""
    with Router(sharded, listen=False) as router:
        sharding = Sharding(router)
        try:
            with pytest.raises(sqlalchemy.exc.InternalError, match="read-only transaction"):
                sharding.run(SHARD, add(-4), read_only=True)
            assert sharding.run(SHARD, lambda s: s.scalar(select(func.count()).select_from(Row)), read_only=True) == 50
            assert router.shard_of(sharding.run(SHARD, add(-5))) == SHARD  # a write session after it writes
        finally:
            sharding.dispose()


def test_sqlalchemy_engines_prepare_nothing_through_a_pooler_the_config_does_not_name(sharded: Config, bouncer_root: Path, tmp_path: Path) -> None:
    """A config whose only connection strings lead to PgBouncer in transaction mode, its mode not said: the Router
    finds the pooler and prepares nothing; the engines did prepare (after 5 runs of a statement), and the statement
    was missing once a transaction of that client ran on another server connection."""
    bouncer = pgbouncer.start(bouncer_root, sharded.databases, mode="transaction")
    try:
        path = tmp_path / "app.toml"
        path.write_text("[databases]\n" + "".join(f'{n} = "{bouncer.dsn(n)}"\n' for n in sharded.databases), encoding="utf-8")
        with Router.from_config(str(path), listen=False) as router:
            sharding = Sharding(router, pool_size=1)
            count = lambda s: s.scalar(select(func.count()).select_from(Row))  # noqa: E731
            try:
                for _ in range(8):
                    assert sharding.run(SHARD, count) == 50
                with psycopg.connect(bouncer.dsn("db1")) as other:  # takes the server connection the engine's ran on
                    other.execute("SELECT 1")
                    assert sharding.run(SHARD, count) == 50  # its transaction on another one
            finally:
                sharding.dispose()
    finally:
        bouncer.stop()


def test_a_sqlalchemy_unit_whose_work_caught_a_statements_error_raises_and_writes_nothing(sharded: Config) -> None:
    """A failed statement aborts the shard's transaction; work that caught its error and returned used to be
    reported as done, its row's ID returned, while the COMMIT rolled it back without an error (as Router's units).
    Caught inside a savepoint (begin_nested), only the savepoint is undone and the rest commits."""
    def caught(savepoint: bool) -> Callable[[Any], int]:
        def work(session: Any) -> int:
            row_id = add(-8)(session)
            try:
                if savepoint:
                    with session.begin_nested():
                        session.execute(text("SELECT 1 / 0"))
                else:
                    session.execute(text("SELECT 1 / 0"))
            except sqlalchemy.exc.DBAPIError:
                pass
            return row_id
        return work

    with Router(sharded, listen=False) as router:
        sharding = Sharding(router, pool_size=1)
        try:
            with pytest.raises(RoutingError, match="failed and the work went on: .* so nothing of it was committed"):
                sharding.run(SHARD, caught(False))
            kept = sharding.run(SHARD, caught(True))
            assert sharding.run(SHARD, lambda s: s.scalar(select(func.count()).select_from(Row).where(Row.v == -8)), read_only=True) == 1
            assert sharding.run(SHARD, lambda s: s.get(Row, kept).v, read_only=True) == -8
        finally:
            sharding.dispose()


def test_numbers_no_id_can_be_are_keys_of_the_sessions_shard(sharded: Config) -> None:
    """session.get of a number that is no ID of this installation (negative, wider than the layout, naming a shard
    beyond the count: a bogus ID from a URL) is looked up in the session's shard like any other key, and finds
    nothing; it was an InputError about `pgidgen decode` out of session.get."""
    not_ids = (-1, -(2**63), 2**63 - 1)  # the last names shard 8191 of 4
    with Router(sharded, listen=False) as router:
        sharding = Sharding(router, pool_size=1)
        try:
            for value in not_ids:
                assert sharding.run(SHARD, lambda s: s.get(Row, value), read_only=True) is None  # noqa: B023 - run within this iteration
            with sharding.session() as session:  # no shard of its own: where a key goes is not said
                with pytest.raises(RoutingError, match="no shard for objects without an ID"):
                    session.get(Row, -1)
            sharding.run(SHARD, lambda s: s.add(Row(id=-1, v=-9)))  # a new object with such a key: the session's shard
            assert sharding.run(SHARD, lambda s: s.get(Row, -1).v, read_only=True) == -9
        finally:
            sharding.dispose()
        partial = Sharding(router, engines={"db2": sharding.engines["db2"]})  # SHARD is on db1
        with pytest.raises(RoutingError, match="shard 1 is on database db1, for which this Sharding has no engine"):
            partial.run(SHARD, lambda s: s.get(Row, -1))
