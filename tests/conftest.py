"""Fixtures: real PostgreSQL servers, never mocks.

By default, three throwaway local clusters started with pgidgen's own sandbox code (as the `postgres` user when
the tests run as root), of the major PGIDGEN_PG_VERSION names (else the first installation pgidgen finds:
pgidgen.pgbin). PGIDGEN_TEST_DSNS="dsn1,dsn2,..." points the tests at existing servers instead (each needs a
role that may CREATE DATABASE; at least two servers). Each test gets fresh databases on every server.

`pg_major_server(N)` starts (once per session) a server of major N for the version-sensitive and cross-version
tests (marked `versions`). A major whose programs cannot be had is skipped with the reason, except under CI
(CI=true), where it fails: CI must not skip a version.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgidgen import pgbin, sandbox
from pgidgen.config import Config
from pgidgen.layout import Layout

SERVERS = 3


@dataclass
class TestServer:
    __test__ = False  # a fixture type, not a test class
    name: str
    dsn: str  # admin DSN (database that exists)
    server: sandbox.Server | None = None


def _with_db(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


@pytest.fixture(scope="session")
def pg_servers() -> Iterator[list[TestServer]]:
    env = os.environ.get("PGIDGEN_TEST_DSNS")
    if env:
        dsns = [d.strip() for d in env.split(",") if d.strip()]
        if len(dsns) < 2:
            pytest.exit("PGIDGEN_TEST_DSNS must name at least two servers", returncode=3)
        servers = [TestServer(f"db{i + 1}", d) for i, d in enumerate(dsns)]
        for s in servers:
            try:
                psycopg.connect(s.dsn, connect_timeout=5).close()
            except psycopg.Error as e:
                pytest.exit(f"PGIDGEN_TEST_DSNS: cannot connect to {s.name}: {e}", returncode=3)
        yield servers
        return
    root = sandbox.make_root()
    started: list[sandbox.Server] = []
    try:
        for i in range(SERVERS):
            started.append(sandbox.create_server(root, f"db{i + 1}"))
    except Exception as e:
        sandbox.destroy(started, root)
        pytest.exit(f"cannot start throwaway PostgreSQL servers: {e}", returncode=3)
    try:
        yield [TestServer(s.name, s.dsn, s) for s in started]
    finally:
        sandbox.destroy(started, root)


@pytest.fixture(scope="session")
def pg_major_server() -> Iterator[Callable[[int], TestServer]]:
    """A factory: the session's server of PostgreSQL major N, started on first use."""
    root: Path | None = None
    started: dict[int, TestServer] = {}
    failed: dict[int, str] = {}

    def get(major: int) -> TestServer:
        nonlocal root
        if major in started:
            return started[major]
        if major not in failed:
            try:
                inst = pgbin.server(major)
            except sandbox.SandboxError:
                try:
                    inst = pgbin.install(major, log=False)
                except sandbox.SandboxError as e:
                    failed[major] = str(e)
            if major not in failed:
                try:
                    root = root or sandbox.make_root()
                    srv = sandbox.create_server(root, f"pg{major}", major=inst.major)
                    started[major] = TestServer(f"pg{major}", srv.dsn, srv)
                    return started[major]
                except sandbox.SandboxError as e:
                    failed[major] = str(e)
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL {major} is needed and could not be started: {failed[major]}")
        pytest.skip(f"PostgreSQL {major} could not be had here: {failed[major]}")

    try:
        yield get
    finally:
        sandbox.destroy([t.server for t in started.values() if t.server], root)


def fresh_database(server: TestServer) -> Iterator[str]:
    """A new empty database on one server, dropped afterwards."""
    dbname = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        yield _with_db(server.dsn, dbname)
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@pytest.fixture
def fresh_dsns(pg_servers: list[TestServer]) -> Iterator[dict[str, str]]:
    """A new empty database on every server: {"db1": dsn, "db2": dsn, ...}; dropped afterwards."""
    dbname = "t_" + uuid.uuid4().hex[:12]
    made: list[TestServer] = []
    for s in pg_servers:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        made.append(s)
    try:
        yield {s.name: _with_db(s.dsn, dbname) for s in made}
    finally:
        for s in made:
            with psycopg.connect(s.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@pytest.fixture
def layout() -> Layout:
    return Layout.make()


@pytest.fixture
def config(fresh_dsns: dict[str, str], layout: Layout) -> Config:
    return Config(layout=layout, databases=dict(fresh_dsns))


@pytest.fixture
def config_file(tmp_path: Path, fresh_dsns: dict[str, str], layout: Layout) -> Path:
    from pgidgen.config import write_config

    path = tmp_path / "pgidgen.toml"
    write_config(path, layout, fresh_dsns)
    return path
