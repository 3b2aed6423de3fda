"""The source fails over mid-move: db1's server stopped (immediate) at a step of the move of a shard to db2, its
streaming standby promoted and the config's db1 repointed at it, as an operator does. `--resume` completes the
move (copying again when the source's slot did not survive the failover: slots are not replicated to a physical
standby, unless PostgreSQL 17+'s failover slots are synchronized to it) and `--rollback` undoes it: the shard
served by the promoted source, the target empty, no slot, publication or subscription left anywhere.

The standby is synchronous (synchronous_standby_names), so every write the application saw acknowledged, and the
move's journal, is on it when the primary stops."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from movekit import Writer, leftovers
from moveshards import Crash, quick_subscription_start, rows_of, serving, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen import pgbin, sandbox
from pgidgen.config import Config
from pgidgen.move import MoveError, MoveOptions, move_shard, resume_move, rollback_move
from pgidgen.versions import has

pytestmark = pytest.mark.sensitive  # slots and promotion differ between majors: runs on every one

SHARD = 1


@dataclass
class Pair:
    primary: sandbox.Server
    standby: sandbox.Server
    config: Config  # db1 on the primary, db2 and db3 on the session's servers

    def fail_over(self) -> Config:
        """The primary stopped at once, the standby promoted: the config with db1 pointing at it."""
        sandbox.stop(self.primary, mode="immediate")
        with psycopg.connect(self.standby.dsn, autocommit=True) as c:
            c.execute("SELECT pg_promote(true, 60)")
        return Config(layout=self.config.layout, databases={**self.config.databases, "db1": self.standby.dsn})


@pytest.fixture
def pair(fresh_dsns: dict[str, str], config: Config) -> Iterator[Pair]:
    root = sandbox.make_root()
    primary = sandbox.create_server(root, "primary")
    replica = sandbox.Server(name="standby", port=sandbox.free_port(), datadir=str(root / "standby"), bindir=primary.bindir, version=primary.version)
    basebackup = Path(primary.bindir) / "pg_basebackup"
    if not basebackup.is_file():  # the npm registry's builds of 15-17 have no client programs
        basebackup = pgbin.clients().bindir / "pg_basebackup"
    try:
        sandbox._run([str(basebackup), "-D", replica.datadir, "-R", "-X", "stream", "-c", "fast",
                      "-d", f"host=127.0.0.1 port={primary.port} user={sandbox.SUPERUSER}"], what="pg_basebackup the standby")
        settings = Path(replica.datadir) / "postgresql.auto.conf"
        # -R's primary_conninfo is the client tools' libpq's: a newer one names options (sslnegotiation, 17+) that an
        # older server's walreceiver refuses, so the standby never connects; the server's own words instead
        kept = [line for line in settings.read_text().splitlines() if not line.startswith("primary_conninfo")]
        settings.write_text("\n".join(kept) + f"\nprimary_conninfo = 'host=127.0.0.1 port={primary.port} user={sandbox.SUPERUSER}"
                            f" application_name=standby'\nport = {replica.port}\nunix_socket_directories = '{replica.datadir}'\n"
                            "cluster_name = 'standby'\nwal_retrieve_retry_interval = '100ms'\n")
        sandbox.start(replica)
        with psycopg.connect(primary.dsn, autocommit=True) as c:  # the standby streams synchronously before the test starts
            c.execute("SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby'")
            deadline = time.monotonic() + 60
            while not c.execute("SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'").fetchone():
                assert time.monotonic() < deadline, "the standby did not stream within 60 s: see its log in " + str(root)
                time.sleep(0.02)
            c.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            c.execute("SELECT pg_reload_conf()")
            while not c.execute("SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby' AND sync_state = 'sync'").fetchone():
                assert time.monotonic() < deadline, "the standby did not become synchronous within 60 s"
                time.sleep(0.02)
        yield Pair(primary, replica, Config(layout=config.layout, databases={**config.databases, "db1": primary.dsn}))
    finally:
        sandbox.destroy([replica, primary], root)
        with psycopg.connect(config.dsn("db2"), autocommit=True) as c:  # a failed test's subscription: its database must go
            for (name,) in c.execute("SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchall():
                for stmt in ("ALTER SUBSCRIPTION {} DISABLE", "ALTER SUBSCRIPTION {} SET (slot_name = NONE)", "DROP SUBSCRIPTION {}"):
                    c.execute(psycopg.sql.SQL(stmt).format(psycopg.sql.Identifier(name)))


def _stopped_at(pair: Pair, point: str) -> tuple[Config, Writer, list[tuple[object, ...]]]:
    """The move of shard 1 from db1 to db2 under a writer, db1 failed over when it reaches point (the move stops
    there); the repointed config, the writer (still writing, to the promoted db1) and the rows before."""
    cfg = pair.config
    setup_shards(cfg, rows=200)
    before = rows_of(cfg.dsn("db1"), f"shard_{SHARD}")
    dsns = dict(cfg.databases)
    w = Writer(dsns, SHARD, delay=0.002)
    w.start()
    while len(w.ids) < 20:
        time.sleep(0.005)
    after: list[Config] = []

    def hook(where: str) -> None:
        if where == point and not after:
            with psycopg.connect(cfg.dsn("db1"), autocommit=True) as c:  # 17+: pgidgen's slot is a failover slot
                slots = c.execute("SELECT * FROM pg_replication_slots WHERE slot_name LIKE 'pgidgen_move_%'").fetchall()
                if slots and has(c, "failover_slots"):
                    assert c.execute("SELECT bool_and(failover) FROM pg_replication_slots WHERE slot_name LIKE 'pgidgen_move_%'").fetchone() == (True,)
            after.append(pair.fail_over())
            dsns["db1"] = pair.standby.dsn  # the application follows the failover too
            raise Crash(where)

    try:
        with pytest.raises((Crash, MoveError)):  # copy:restored: the rows are in on db2, not committed
            move_shard(cfg, SHARD, "db2", options=MoveOptions(fault_wait=0), hook=hook)
        assert after, "the move never reached " + point
        n = len(w.ids)
        while len(w.ids) < n + 20 and w.is_alive():  # it writes on the promoted source
            time.sleep(0.005)
    except BaseException:
        w.stop()
        raise
    return after[0], w, before


@pytest.mark.parametrize("point", ["catchup"])  # copy:restored resumes as after any stop (tests/test_move_interrupt.py)
def test_resume_after_the_source_failed_over(pair: Pair, point: str) -> None:
    cfg, w, before = _stopped_at(pair, point)
    try:
        report = resume_move(cfg, SHARD)
        n = len(w.ids)
        while len(w.ids) < n + 20 and w.is_alive():
            time.sleep(0.005)
    finally:
        w.stop()
    assert report.status == "done", report
    assert report.verification is not None and report.verification.ok
    assert serving(cfg)[SHARD] == ["db2"]
    nothing_lost(cfg, w, before)
    assert leftovers(cfg.databases) == []
    # the subscription streamed from the old primary's slot, which the standby did not have: copied again, and said so
    again = "the source's slot was gone (a failover of db1?): copied shard 1 again (the target had never served it)"
    assert (again in report.lines()) == (point == "catchup"), report.lines()


@pytest.mark.parametrize("point", ["copy:restored"])  # the suite's time is shared: one stop point each way
def test_rollback_after_the_source_failed_over(pair: Pair, point: str) -> None:
    cfg, w, before = _stopped_at(pair, point)
    try:
        report = rollback_move(cfg, SHARD)
    finally:
        w.stop()
    assert report.status == "rolled_back", report
    assert serving(cfg)[SHARD] == ["db1"]
    assert state_of(cfg.dsn("db2"), SHARD) is None
    nothing_lost(cfg, w, before)
    assert leftovers(cfg.databases) == []


def nothing_lost(cfg: Config, w: Writer, before: list[tuple[object, ...]]) -> None:
    """moveshards.writers_saw_nothing_lost, but for the one INSERT in flight when db1 stopped: committed on the
    synchronous standby, its answer lost with the connection, it may be there though it was never acknowledged."""
    [where] = serving(cfg)[SHARD]
    ids = [r[0] for r in rows_of(cfg.dsn(where), f"shard_{SHARD}")]
    assert len(ids) == len(set(ids)), "a row twice"
    assert w.ids == sorted(w.ids) and len(set(w.ids)) == len(w.ids), "IDs acknowledged twice or not rising"
    want = {r[0] for r in before} | set(w.ids)
    assert want <= set(ids), f"acknowledged writes lost: {sorted(want - set(ids))}"
    assert len(set(ids) - want) <= 1, f"rows nobody wrote: {sorted(set(ids) - want)}"
