"""A database that is down is not a move (issue 36): with db2's server really stopped (pg_ctl stop), every call for
one of its shards fails with DatabaseUnavailableError, which names it, within the connect timeout (then at once:
the breaker), while db1's shards keep serving; started again, db2's shards serve again through the breaker's
half-open probe. Sync Router under 8 threads, AsyncRouter, and the SQLAlchemy and Django integrations; and a host
that never answers a connect."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from test_routing import SHARDS, TABLE, count, create_in_shards, insert

from pgidgen import sandbox
from pgidgen.config import Config
from pgidgen.errors import DatabaseUnavailableError
from pgidgen.idgen import schema_name
from pgidgen.init import init
from pgidgen.integrations.sqlalchemy import Sharding
from pgidgen.routing import AsyncRouter, Router
from pgidgen.routing.breaker import CONNECT_TIMEOUT, PROBE_EVERY

#: spread: shards 0-3 on db1, 4-7 on db2
ON_DB1, ON_DB2 = range(4), range(4, 8)
#: what a call may take beyond the connect timeout before it fails: the bound the tests assert is derived from the
#: configured timeout (two shared CPUs schedule 8 threads), not a performance figure
MARGIN = 1.0
BOUND = CONNECT_TIMEOUT + MARGIN

Outcome = tuple[int, float, BaseException | None]


@pytest.fixture
def spread(config: Config) -> Config:
    """8 shards over db1 and db2 (0-3, 4-7), an items table in each (as test_routing's sharded)."""
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    create_in_shards(config, TABLE)
    return config


@pytest.fixture
def db2_server(pg_servers: list[Any], fresh_dsns: dict[str, str]) -> Iterator[sandbox.Server]:
    """db2's sandbox server, for the test to stop; running again afterwards whatever happened (before fresh_dsns
    drops its database there)."""
    server = next(s for s in pg_servers if s.name == "db2").server
    if server is None:
        pytest.skip("needs a sandbox server it may stop (not PGIDGEN_TEST_DSNS)")
    try:
        yield server
    finally:
        if not (Path(server.datadir) / "postmaster.pid").exists():
            sandbox.start(server)
        sandbox.wait_ready(server)


def timed(router: Router, shard: int) -> Outcome:
    t0 = time.monotonic()
    try:
        router.run(shard, insert(shard))
        return shard, time.monotonic() - t0, None
    except Exception as e:  # noqa: BLE001 - every outcome is looked at by the test
        return shard, time.monotonic() - t0, e


def hammer(router: Router, *, threads: int = 8, seconds: float) -> list[Outcome]:
    """threads threads calling Router.run round the 8 shards (each from its own start) for `seconds`."""
    out: list[Outcome] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def worker(first: int) -> None:
        n = first
        while time.monotonic() < until:
            outcome = timed(router, n % 8)
            with lock:
                out.append(outcome)
            n += 1

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return out


def assert_down(outcomes: list[Outcome]) -> None:
    """db2's calls each failed with DatabaseUnavailableError naming db2 within BOUND; db1's all succeeded."""
    down = [(s, dt, e) for s, dt, e in outcomes if s in ON_DB2]
    up = [(s, dt, e) for s, dt, e in outcomes if s in ON_DB1]
    assert down and up
    assert [e for _, _, e in up if e is not None] == []
    wrong = [f"{type(e).__name__}: {e}" for _, _, e in down if not isinstance(e, DatabaseUnavailableError)]
    assert wrong == []
    for _, _, e in down:
        assert isinstance(e, DatabaseUnavailableError) and e.database == "db2" and not e.retryable
        assert "database db2" in str(e) and "unreachable" in str(e)
    slowest = max(dt for _, dt, _ in down)
    assert slowest < BOUND, f"a call for the stopped database took {slowest:.2f}s (connect timeout {CONNECT_TIMEOUT}s)"


def recover(call: Any) -> float:
    """Seconds until call() (a db2 shard's) works again after db2 restarted: the breaker lets one call through every
    PROBE_EVERY; the others fail at once meanwhile."""
    t0 = time.monotonic()
    while True:
        try:
            call()
            return time.monotonic() - t0
        except DatabaseUnavailableError:
            assert time.monotonic() - t0 < PROBE_EVERY + BOUND, "db2's shards did not serve again after its restart"
            time.sleep(0.02)


def test_a_stopped_database_fails_its_calls_at_once_and_the_others_keep_serving(spread: Config, db2_server: sandbox.Server) -> None:
    with Router(spread, retry_for=10.0) as router:  # retry_for as by default: never spent on a database that is down
        for shard in range(8):  # every pool open, its connections idle (and broken once db2 stops)
            router.run(shard, insert(shard))
        sandbox.stop(db2_server)

        t0 = time.monotonic()
        outcomes = hammer(router, seconds=2.5)
        window = time.monotonic() - t0
        assert_down(outcomes)
        calls = sum(1 for s, _, _ in outcomes if s in ON_DB2)
        # the breaker: one call a PROBE_EVERY connected to find out, the others failed at once
        assert router.stats["probes"] <= window / PROBE_EVERY + 2 < calls, (router.stats, calls)
        assert router.stats["retries"] == 0 and router.stats["moved"] == 0, router.stats

        # a Router started while db2 is down has no map of where db2's shards were: still not a move
        with Router(spread, listen=False) as late:
            _, dt, e = timed(late, 5)
            assert isinstance(e, DatabaseUnavailableError), e
            assert "database db2 is unreachable, and no other database serves shard 5" in str(e) and dt < BOUND
            assert timed(late, 1)[2] is None

            sandbox.start(db2_server)
            probes = router.stats["probes"]
            recover(lambda: router.run(5, insert(5)))
            assert router.stats["probes"] > probes  # back through the half-open probe
            recover(lambda: late.run(6, insert(6)))  # its map read again (not listening: polled while db2 was out of it)
        after = hammer(router, seconds=0.5)
        assert [f"{s}: {e}" for s, _, e in after if e is not None] == []
    # what failed wrote nothing, what succeeded is there: the warm-up's 4, the two recoveries', the last round's
    written = 4 + 2 + sum(1 for s, _, e in after if e is None and s in ON_DB2)
    assert sum(count(spread.dsn("db2"), schema_name(s)) for s in ON_DB2) == written


def test_async_router_fails_a_stopped_database_at_once_and_recovers(spread: Config, db2_server: sandbox.Server) -> None:
    async def ainsert(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("INSERT INTO items (k) VALUES (0)")

    async def call(r: AsyncRouter, shard: int) -> Outcome:
        t0 = time.monotonic()
        try:
            await r.run(shard, ainsert)
            return shard, time.monotonic() - t0, None
        except Exception as e:  # noqa: BLE001 - looked at by the test
            return shard, time.monotonic() - t0, e

    async def main() -> tuple[list[Outcome], dict[str, int]]:
        async with AsyncRouter(spread, listen=False) as r:
            await asyncio.gather(*(r.run(s, ainsert) for s in range(8)))
            await asyncio.to_thread(sandbox.stop, db2_server)
            outcomes = [o for _ in range(3) for o in await asyncio.gather(*(call(r, s) for s in range(8) for _ in range(2)))]
            await asyncio.to_thread(sandbox.start, db2_server)
            t0 = time.monotonic()
            while (await call(r, 6))[2] is not None:
                assert time.monotonic() - t0 < PROBE_EVERY + BOUND, "db2's shards did not serve again after its restart"
                await asyncio.sleep(0.02)
            return outcomes, dict(r.stats)

    outcomes, stats = asyncio.run(main())
    assert_down(outcomes)
    assert stats["retries"] == 0 and stats["probes"] >= 1, stats


def test_sqlalchemy_sharding_fails_a_stopped_database_at_once(spread: Config, db2_server: sandbox.Server) -> None:
    def write(shard: int) -> Any:
        return lambda session: session.execute(text("INSERT INTO items (k) VALUES (:k) RETURNING id"), {"k": shard}).scalar()

    with Router(spread, listen=False) as router:
        sharding = Sharding(router)
        try:
            assert sharding.run(5, write(5)) and sharding.run(1, write(1))  # the engines' connections made
            sandbox.stop(db2_server)
            for _ in range(2):  # the first finds the engine's connection broken and db2 not answering; the next fails at once
                t0 = time.monotonic()
                with pytest.raises(DatabaseUnavailableError, match="database db2 .* is unreachable"):
                    sharding.run(5, write(5))
                assert time.monotonic() - t0 < BOUND
            assert router.stats["unreachable"] >= 2 and "db2" in router.pools.down
            assert sharding.run(1, write(1))
            sandbox.start(db2_server)
            recover(lambda: sharding.run(5, write(5)))
        finally:
            sharding.dispose()


def test_a_database_that_does_not_answer_fails_within_the_connect_timeout(spread: Config) -> None:
    """A connect that times out (a host that takes the connection and never answers: hung, or behind a black hole)
    is the same as a refused one: the call that finds it waits the connect timeout, those after it fail at once."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes the handshake; nobody ever answers
        port = silent.getsockname()[1]
        dsns = {**spread.databases, "db2": f"postgresql://postgres:secret@127.0.0.1:{port}/app"}
        with Router(Config(layout=spread.layout, databases=dsns), listen=False) as router:
            _, dt, e = timed(router, 5)
            assert isinstance(e, DatabaseUnavailableError) and e.database == "db2", e
            assert CONNECT_TIMEOUT - 0.5 < dt < BOUND, dt  # it did wait for the connect, and no longer
            assert "secret" not in str(e)
            probes = router.stats["probes"]
            router.invalidate()  # the map is read again: db2 is not waited for again within PROBE_EVERY
            _, dt, e = timed(router, 6)
            assert isinstance(e, DatabaseUnavailableError) and router.stats["probes"] == probes and dt < BOUND
            assert timed(router, 1)[2] is None


#: A Django process (Django is configured once per process): writes through run_on_shard to a shard of db1 and of
#: db2, says "ready", and after a line on stdin (db2 stopped) tries db2's twice and db1's once, printing each outcome.
DJANGO_APP = """
import sys, time
import django
from django.conf import settings
from pgidgen.integrations.django import databases
settings.configure(DATABASES=databases(), INSTALLED_APPS=[], USE_TZ=True)
django.setup()
from django.db import connections
from pgidgen.errors import DatabaseUnavailableError
from pgidgen.idgen import schema_name
from pgidgen.init import init
from pgidgen.integrations.django import get_router, run_on_shard

def write(shard):
    def work():
        with connections[get_router().database_for(shard)].cursor() as cursor:
            cursor.execute("INSERT INTO items (k) VALUES (%s)", [shard])
    return lambda: run_on_shard(shard, work)

write(5)(), write(1)()
print("ready", flush=True)
sys.stdin.readline()
for shard in (5, 5, 1):
    t0 = time.monotonic()
    try:
        write(shard)()
        print(shard, "ok", flush=True)
    except DatabaseUnavailableError as e:
        print(shard, e.database, time.monotonic() - t0, flush=True)
"""


def test_django_run_on_shard_fails_a_stopped_database_at_once(spread: Config, config_file: Path, db2_server: sandbox.Server) -> None:
    pytest.importorskip("django")
    env = {**os.environ, "PGIDGEN_CONFIG": str(config_file)}
    app = subprocess.Popen([sys.executable, "-c", DJANGO_APP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert app.stdout is not None and app.stdin is not None
        line = app.stdout.readline()
        assert line == "ready\n", line + (app.stderr.read() if app.stderr else "")
        sandbox.stop(db2_server)
        app.stdin.write("stopped\n")
        app.stdin.flush()
        out, err = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err
    lines = [line.split() for line in out.splitlines()]
    assert [line[:2] for line in lines] == [["5", "db2"], ["5", "db2"], ["1", "ok"]], out + err
    assert all(float(line[2]) < BOUND for line in lines[:2]), out  # the first within the connect timeout, then at once
