"""apply-ddl on live shards: its locks are taken under a short lock_timeout and retried, so an application query
never queues behind it for long, and the session it waited on is named (issue 32, item 1)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move import move_shard


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


@pytest.fixture
def live(config: Config, config_file: Path, tmp_path: Path) -> Config:
    """Shards 0-1 on db1 with a table t holding rows, and the file that changes it."""
    init(config, 4, ["db1", "db2"])
    (tmp_path / "t.sql").write_text("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_id(), v int);\n")
    assert cli(config_file, "apply-ddl", str(tmp_path / "t.sql")).exit_code == 0
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("INSERT INTO shard_0.t (v) SELECT generate_series(1, 50); INSERT INTO shard_1.t (v) SELECT generate_series(1, 50)")
    (tmp_path / "note.sql").write_text("ALTER TABLE t ADD COLUMN note text;\n")
    return config


@pytest.fixture
def report(live: Config) -> Iterator[psycopg.Connection[tuple[int]]]:
    """A long report's open transaction on shard 1's table."""
    conn = psycopg.connect(live.dsn("db1"), application_name="monthly report")
    conn.execute("SELECT count(*) FROM shard_1.t")
    try:
        yield conn
    finally:
        conn.close()


class App(threading.Thread):
    """Reads shard 0 (done before shard 1 in apply-ddl's transaction) again and again: its longest wait."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn, self.stop, self.longest = dsn, threading.Event(), 0.0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                t0 = time.monotonic()
                conn.execute("SELECT count(*) FROM shard_0.t")
                self.longest = max(self.longest, time.monotonic() - t0)
                time.sleep(0.01)


def columns(config: Config) -> dict[str, int]:
    out = {}
    for name in ("db1", "db2"):
        with psycopg.connect(config.dsn(name)) as conn:
            out[name] = conn.execute("SELECT count(*) FROM pg_attribute WHERE attname = 'note' AND attrelid::regclass::text LIKE 'shard_%.t'").fetchone()[0]
    return out


def test_apply_ddl_waits_for_a_long_transaction_without_queueing_the_application(
    live: Config, config_file: Path, tmp_path: Path, report: psycopg.Connection[tuple[int]]
) -> None:
    app = App(live.dsn("db1"))
    app.start()
    threading.Timer(2.0, report.rollback).start()  # the report ends after 2 s
    try:
        res = cli(config_file, "apply-ddl", str(tmp_path / "note.sql"), "--lock-timeout", "100ms")
    finally:
        app.stop.set()
        app.join()
    assert res.exit_code == 0, res.output
    assert f"db1: shard_1 waits for a lock held by pid {report.info.backend_pid} (monthly report), transaction open" in res.stderr, res.stderr
    assert "SELECT count(*) FROM shard_1.t; rolled back, trying again" in res.stderr
    assert res.stdout.splitlines()[:2] == ["db1: applied note.sql (#2) to 2 shards (0-1)", "db2: applied note.sql (#2) to 2 shards (2-3)"]
    assert columns(live) == {"db1": 2, "db2": 2}
    # behind a plain ALTER the reader would have waited the report's 2 s; here one try's lock_timeout and its rollback
    assert app.longest < 0.1 + 1.0, f"the application waited {app.longest:.2f} s"


def test_apply_ddl_gives_up_at_its_deadline_naming_the_session(
    live: Config, config_file: Path, tmp_path: Path, report: psycopg.Connection[tuple[int]]
) -> None:
    # --atomic: all or nothing until the first wait (by default, shard 0 may have committed alone before shard 1 waited)
    res = cli(config_file, "apply-ddl", str(tmp_path / "note.sql"), "--atomic", "--lock-timeout", "100ms", "--lock-wait", "1s")
    assert res.exit_code == 1, res.output
    last = next(line for line in res.stdout.splitlines() if line.startswith("db1: "))
    assert res.output.strip().splitlines()[-1] == "Error: 1 of 3 databases failed (db1); the others are as reported above"
    assert last.startswith(f"db1: failed: gave up after 1 s waiting for a lock held by pid {report.info.backend_pid}"
                           " (monthly report), transaction open "), last
    assert last.endswith(": SELECT count(*) FROM shard_1.t (db1, shard 1): end or wait for that transaction (pg_terminate_backend(pid)"
                         " ends it), then run again (nothing was applied there)"), last
    # once db1 waited, db2 committed rather than hold its shards' locks (its application would queue behind them)
    assert columns(live) == {"db1": 0, "db2": 2}
    assert next(line for line in res.stdout.splitlines() if line.startswith("db2: ")) == "db2: applied note.sql (#2) to 2 shards (2-3)"
    report.rollback()
    again = cli(config_file, "apply-ddl", str(tmp_path / "note.sql"))
    assert again.exit_code == 0, again.output
    assert columns(live) == {"db1": 2, "db2": 2}


def test_apply_ddl_during_a_move_leaves_the_moving_shard_alone_then_catches_it_up(live: Config, config_file: Path, tmp_path: Path) -> None:
    """apply-ddl while shard 0 moves from db1 to db3 (run from the move's catch-up): it applies the file to the
    other shards and leaves shard 0 out, saying so; the move does not fail; the next apply-ddl catches shard 0
    up where it lives now."""
    seen: dict[str, Result] = {}

    def hook(point: str) -> None:
        if point == "catchup":
            seen["apply"] = cli(config_file, "apply-ddl", str(tmp_path / "note.sql"))

    report = move_shard(live, 0, "db3", hook=hook)
    assert report.status == "done", report.lines()
    res = seen["apply"]
    assert res.exit_code == 0, res.output
    assert ("db1: applied note.sql (#2) to 1 shards (1); left out shards 0, being moved (the move copies them as they are):"
            " run apply-ddl again once it is done to catch them up") in res.output.splitlines(), res.output
    assert columns(live) == {"db1": 1, "db2": 2}
    again = cli(config_file, "apply-ddl", str(tmp_path / "note.sql"))
    assert again.exit_code == 0, again.output
    assert "db3: applied note.sql (#2) to 1 shards (0)" in again.output.splitlines(), again.output
    with psycopg.connect(live.dsn("db3")) as conn:
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attname = 'note' AND attrelid = 'shard_0.t'::regclass").fetchone() == (1,)
    assert cli(config_file, "status", "--drift").exit_code == 0


def test_a_move_waits_for_an_apply_ddl_running_in_its_source(live: Config) -> None:
    """apply-ddl holds its lock on db1 for a second (as while it runs): a move from db1 waits, then goes on."""
    from pgidgen.ddl.ledger import DDL_LOCK
    from pgidgen.idgen import LOCK_CLASS

    with psycopg.connect(live.dsn("db1"), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, DDL_LOCK))
        release = threading.Timer(1.0, lambda: holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, DDL_LOCK)))
        release.start()
        report = move_shard(live, 0, "db3")
        release.join()
    assert report.status == "done" and report.verification is not None and report.verification.ok, report.lines()
