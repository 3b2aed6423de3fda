"""The Router behind a real PgBouncer (Debian's package), in transaction and in session mode, in front of real
databases: a writer through the Router during a real move-shard sees no exception, and every acknowledged write
is stored once, on the database that serves the shard. Skipped only when pgbouncer cannot be had (never under
CI=true, where that fails)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from movekit import writes_around

from pgidgen import pgbouncer, sandbox
from pgidgen.config import Config, load_config
from pgidgen.init import init
from pgidgen.move import move_shard
from pgidgen.routing import Router

SHARDS = 4  # db1: 0-1, db2: 2-3, db3: none (the target)


@pytest.fixture
def bouncer_root() -> Iterator[Path]:
    if pgbouncer.find() is None:
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is needed (apt-get install pgbouncer; make deps installs it)")
        pytest.skip("pgbouncer is not installed and could not be (make deps installs it)")
    root = sandbox.make_root()
    yield root
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def sharded(config: Config) -> None:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.t (id bigint PRIMARY KEY DEFAULT shard_1.next_id(), v int NOT NULL)")
        c.execute("INSERT INTO shard_1.t (v) SELECT g FROM generate_series(1, 50) g")


def app_config(tmp_path: Path, config: Config, bouncer: pgbouncer.Bouncer, pooler: str | None) -> Path:
    """pgidgen.toml as an application deploys it: each database's direct DSN for pgidgen's commands, the pooler's
    for the app; pooler = ... only when given (else the Router finds out)."""
    lines = ["[databases]"]
    for name, dsn in config.databases.items():
        extra = f', pooler = "{pooler}"' if pooler else ""
        lines.append(f'{name} = {{ admin_dsn = "{dsn}", app_dsn = "{bouncer.dsn(name)}"{extra} }}')
    path = tmp_path / "app.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_during_a_move(router: Router, config: Config, api: str = "run") -> tuple[list[int], list[BaseException]]:
    """Writes through Router.run (a transaction: BEGIN + claim + INSERT, then COMMIT) or Router.execute (claim,
    INSERT and commit in one round trip) while shard 1 moves to db3."""
    write = "INSERT INTO t (v) VALUES (%s) RETURNING id"
    if api == "run":
        def one(n: int) -> int:
            return int(router.run(1, lambda c: c.execute(write, (n,)).fetchone()[0]))
    else:
        def one(n: int) -> int:
            return int(router.execute(1, write, (n,))[0][0])
    ids, errors, report = writes_around(one, lambda: move_shard(config, 1, "db3"))
    assert report.status == "done" and report.verification is not None and report.verification.ok
    return ids, errors


@pytest.mark.parametrize(("mode", "api"), [("transaction", "run"), ("session", "run"), ("transaction", "execute")])
def test_a_writer_through_pgbouncer_during_a_move_sees_nothing(mode: str, api: str, config: Config, bouncer_root: Path, tmp_path: Path) -> None:
    sharded(config)
    bouncer = pgbouncer.start(bouncer_root, config.databases, mode=mode)
    try:
        # transaction mode: the config does not say it, the Router finds the pooler; session mode: it says so
        path = app_config(tmp_path, config, bouncer, None if mode == "transaction" else "session")
        with Router.from_config(str(path)) as router:
            router.run(1, lambda c: c.execute("SELECT 1"))
            assert router.pools.policy("db1").pooler == mode
            assert router.pools.policy("db1").prepare is (mode == "session")
            assert router.maps._hearing == {"db1", "db2", "db3"}  # LISTEN on the direct connections
            ids, errors = write_during_a_move(router, load_config(path), api)
            assert router.database_for(1) == "db3"
            assert router.stats["retries"] <= 3
    finally:
        bouncer.stop()
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    with psycopg.connect(config.dsn("db3")) as c:
        stored = [r[0] for r in c.execute("SELECT id FROM shard_1.t WHERE id = ANY(%s)", (ids,))]
        total = c.execute("SELECT count(*) FROM shard_1.t").fetchone()[0]
    assert len(ids) > 100 and len(set(ids)) == len(ids)  # nothing duplicated
    assert sorted(stored) == sorted(ids) and total == 50 + len(ids)  # nothing lost, nothing else


def test_only_the_poolers_dsn_configured(config: Config, bouncer_root: Path, tmp_path: Path) -> None:
    """An app whose config names only PgBouncer's address (transaction mode): the Router finds the pooler, does not
    LISTEN through it (the notifications would go to whichever client holds the server connection) and polls the
    map versions instead; still nothing reaches the writer."""
    sharded(config)
    bouncer = pgbouncer.start(bouncer_root, config.databases, mode="transaction")
    try:
        path = tmp_path / "app.toml"
        path.write_text("[databases]\n" + "".join(f'{n} = "{bouncer.dsn(n)}"\n' for n in config.databases), encoding="utf-8")
        with Router.from_config(str(path)) as router:
            assert router.database_for(1) == "db1"
            assert router.maps._hearing == set() and router.pools.policy("db2").pooler == "transaction"
            ids, errors = write_during_a_move(router, config)
            time.sleep(1.5)  # one poll of the map versions
            assert router.database_for(1) == "db3"
    finally:
        bouncer.stop()
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    with psycopg.connect(config.dsn("db3")) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM shard_1.t WHERE id = ANY(%s)", (ids,))) == sorted(ids)
    assert len(set(ids)) == len(ids) > 100


def test_through_a_transaction_pooler_the_claim_is_never_prepared(config: Config, bouncer_root: Path, tmp_path: Path) -> None:
    """Each transaction may run on another server connection behind PgBouncer in transaction mode: a statement
    prepared on one is unknown on the next. The claim, prepared once per connection elsewhere, must then go
    unnamed every time, as psycopg's own statements do (no Parse of a named statement in libpq's trace)."""
    import tempfile

    sharded(config)
    bouncer = pgbouncer.start(bouncer_root, config.databases, mode="transaction")
    try:
        path = app_config(tmp_path, config, bouncer, "transaction")
        with Router(load_config(path), listen=False, min_size=1, max_size=1) as router:
            with router._connection("db1") as conn:  # the pool's only connection
                pass
            with tempfile.TemporaryFile("w+") as f:
                conn.pgconn.trace(f.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
                try:
                    for n in range(8):
                        router.run(1, lambda c: c.execute("INSERT INTO t (v) VALUES (%s)", (n,)))  # noqa: B023 - run within this iteration
                finally:
                    conn.pgconn.untrace()
                f.seek(0)
                parses = [line for line in f.read().splitlines() if "\tParse\t" in line]
    finally:
        bouncer.stop()
    assert len(parses) >= 16 and any("pgidgen.claim" in p for p in parses), parses  # the claim and the INSERT, each time
    assert not [p for p in parses if '"_pg3' in p], parses  # none of them named
