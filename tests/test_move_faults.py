"""Moves interrupted at every step (an injected failure, a real kill -9 of the CLI, a server restarted, a pause
that does not fit), then resumed or rolled back: nothing left behind, the shard served by one database."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from moveshards import POINTS, Crash, alive, crash_at, open_moves, quick_subscription_start, rows_of, setup_shards, start_cli, state_of, wait_stopped  # noqa: F401 (an autouse fixture)

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.move import MoveError, MoveOptions, move_shard, resume_move, rollback_move
from pgidgen.move.journal import ONLINE_STEPS, POINT_OF_NO_RETURN


def test_offline_move_interrupted_after_the_target_committed_resumes(config: Config) -> None:
    setup_shards(config, rows=50)
    source_rows = rows_of(config.dsn("db1"), "shard_1")
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", options=MoveOptions(offline=True), hook=crash_at("cutover:frozen"))
    assert state_of(config.dsn("db3"), 1) == ("incoming", "shard_1")  # the copy committed there, indexes and all
    report = resume_move(config, 1)
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert rows_of(config.dsn("db3"), "shard_1") == source_rows
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("point", POINTS)
def test_crash_then_rollback_then_crash_then_resume(config: Config, point: str) -> None:
    setup_shards(config, rows=100)
    source_rows = rows_of(config.dsn("db1"), "shard_1")
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", hook=crash_at(point))
    assert open_moves(config.dsn("db1")) == 1
    # a fresh move of the same shard is refused while the interrupted one is open
    with pytest.raises(MoveError, match="an interrupted move of shard 1 to db3 exists") as refused:
        move_shard(config, 1, "db2")
    step = point.split(":")[0]
    past_flip = ONLINE_STEPS.index(step) > ONLINE_STEPS.index(POINT_OF_NO_RETURN)
    # the hint offers --rollback only where it can work (a fresh-clone review got it offered past the flip)
    assert ("--rollback" in refused.value.render()) is not past_flip, refused.value.render()
    if not past_flip:
        report = rollback_move(config, 1)
        assert report.status == "rolled_back"
        assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")
        assert state_of(config.dsn("db3"), 1) is None
        assert rows_of(config.dsn("db1"), "shard_1") == source_rows
        assert leftovers(config.databases) == []
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            assert c.execute("SELECT to_regnamespace('shard_1')").fetchone()[0] is None
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("INSERT INTO shard_1.t (v) VALUES (-1)")  # the source serves writes again
        source_rows = rows_of(config.dsn("db1"), "shard_1")
        with pytest.raises(Crash):
            move_shard(config, 1, "db3", hook=crash_at(point))
    else:
        with pytest.raises(MoveError, match="past its flip"):
            rollback_move(config, 1)
    report = resume_move(config, 1)
    assert report.status == "done"
    assert report.verification is not None
    assert rows_of(config.dsn("db3"), "shard_1") == source_rows
    assert state_of(config.dsn("db3"), 1) == ("active", "shard_1")
    assert state_of(config.dsn("db1"), 1)[0] == "retired"  # type: ignore[index]
    assert leftovers(config.databases) == []
    assert open_moves(config.dsn("db1")) == 0
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("INSERT INTO shard_1.t (v) VALUES (0) RETURNING id").fetchone()[0] > source_rows[-1][0]


def test_a_retired_copy_without_its_guards_gets_them_on_resume(config: Config) -> None:
    """The retired copy's write guards are made after the flip, beside activate: a move killed before they
    committed (here: dropped by hand after a crash at activate) makes them again when resumed."""
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", hook=crash_at("activate"))
    retired = state_of(config.dsn("db1"), 1)[1]  # type: ignore[index]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for t in ("t", "tags"):
            c.execute(f"DROP TRIGGER pgidgen_retired ON {retired}.{t}")
    assert resume_move(config, 1).status == "done"
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for t in ("t", "tags"):
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="shard 1 moved to database db3"):
                c.execute(f"DELETE FROM {retired}.{t}")
        assert c.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'pgidgen_retired' AND tgenabled = 'A'").fetchone()[0] == 2


def test_kill9_while_frozen_then_resume(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=100)
    proc = start_cli(config_file, "1", "db3", stop_at="cutover:frozen")
    try:
        wait_stopped(proc)
        # while the first mover holds the shard, a second one is refused, and so is a rollback
        with pytest.raises(MoveError, match=r"shard 1 is being moved to db3 right now by another pgidgen .*wait for it to finish"):
            move_shard(config, 1, "db2")
        with pytest.raises(MoveError, match="being moved right now"):
            rollback_move(config, 1)
        proc.kill()  # SIGKILL while the shard's tables are locked on the source
    finally:
        proc.kill()
        proc.wait()
    # the server dropped the dead mover's session: the source takes writes again (the lock is gone)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("SET lock_timeout = '5s'")
        c.execute("INSERT INTO shard_1.t (v) VALUES (-7)")
    expected = rows_of(config.dsn("db1"), "shard_1")
    res = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "--resume"])
    assert res.exit_code == 0, res.output
    assert "moved shard 1 from db1 to db3" in res.output
    assert rows_of(config.dsn("db3"), "shard_1") == expected
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("stop_at", ["copy", "copy:restored"])
def test_kill9_during_copy_then_rollback(config: Config, config_file: Path, stop_at: str) -> None:
    """copy:restored: every row is in the target's open transaction when the mover dies; none of it stays."""
    setup_shards(config, rows=100)
    proc = start_cli(config_file, "2", "db3", stop_at=stop_at)
    try:
        wait_stopped(proc)
    finally:
        proc.kill()
        proc.wait()
    res = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "2", "db3"])
    assert res.exit_code == 1
    assert "an interrupted move of shard 2 to db3 exists" in res.output
    res = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "2", "--rollback"])
    assert res.exit_code == 0, res.output
    assert "rolled back the move of shard 2 to db3" in res.output
    assert leftovers(config.databases) == []
    assert state_of(config.dsn("db1"), 2) == ("active", "shard_2")
    assert state_of(config.dsn("db3"), 2) is None
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace('shard_2')").fetchone()[0] is None
    assert len(rows_of(config.dsn("db1"), "shard_2")) == 100


def test_a_subscription_that_cannot_log_in_is_refused_before_journaling(config: Config, config_file: Path, pg_servers: list[Any]) -> None:
    """The target's server tries the subscription's login before anything is journaled (pgidgen.check's probe): the
    error is one line (libpq's message has a newline) and neither it nor the target server's log shows the
    password of --subscription-dsn (found by a review, when the failure came at the subscription step)."""
    setup_shards(config, rows=10)
    res = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "db3",
                                    "--subscription-dsn", "postgresql://postgres:SubSecret99@127.0.0.1:1/app"])
    assert res.exit_code == 1
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("Error: the server cannot log in to db1 as a subscription: "), res.output
    assert "(db3)" in res.output and "--subscription-dsn" in res.output and "SubSecret99" not in res.output
    # what to fix is the --subscription-dsn given (the hint used to offer passing one)
    assert "with the --subscription-dsn given" in res.output and "or pass --subscription-dsn" not in res.output, res.output
    target = next(s for s in pg_servers if s.name == "db3")
    if target.server is not None:
        assert "SubSecret99" not in Path(target.server.logfile).read_text(errors="replace")
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0, "nothing journaled"
    assert leftovers(config.databases) == []


def test_target_server_restarted_mid_move_then_resume(config: Config, pg_servers: list[Any]) -> None:
    from pgidgen import sandbox

    target = next(s for s in pg_servers if s.name == "db3")
    if target.server is None:
        pytest.skip("needs a sandbox server it may restart")
    setup_shards(config, rows=50)

    restarts: list[str] = []

    def restart(point: str) -> None:
        if point == "catchup" and len(restarts) < 2:  # once per move (a step waited for is run again)
            restarts.append(point)
            sandbox.restart(target.server, mode="immediate")

    with pytest.raises(MoveError, match=r"lost the connection to db3 during step catchup of the move of shard 1 \(--fault-wait 0: no wait\)"):
        move_shard(config, 1, "db3", hook=restart, options=MoveOptions(fault_wait=0))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("INSERT INTO shard_1.t (v) VALUES (-3)")  # written while the move is stopped: carried over on resume
    expected = rows_of(config.dsn("db1"), "shard_1")
    report = resume_move(config, 1)
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert rows_of(config.dsn("db3"), "shard_1") == expected
    assert leftovers(config.databases) == []
    # by default the move waits for the server to be back (--fault-wait) and goes on by itself
    report = move_shard(config, 2, "db3", hook=restart)
    assert len(restarts) == 2 and [f["step"] for f in report.faults] == ["catchup"], report.faults
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert leftovers(config.databases) == []


def test_cutover_that_cannot_fit_max_pause_leaves_the_source_serving(config: Config) -> None:
    setup_shards(config, rows=10)
    held = psycopg.connect(config.dsn("db1"))

    def long_writer(point: str) -> None:  # a long transaction with a write pending on the shard, from the cutover on
        if point == "cutover":
            held.execute("INSERT INTO shard_1.t (v) VALUES (-9)")

    try:
        with pytest.raises(MoveError) as info:
            move_shard(config, 1, "db3", options=MoveOptions(max_pause=0.2, attempts=2), hook=long_writer)
        assert str(info.value) == (
            "shard 1 did not move: the shard's tables could not be locked within --max-pause 200 ms (long transactions on them?)"
            " (2 attempts) (db1): the source keeps serving it; retry with 'pgidgen move-shard --resume 1' (perhaps with a larger"
            " --max-pause, or when writes are lighter) or undo with --rollback 1"
        )
        assert state_of(config.dsn("db1"), 1) == ("moving", "shard_1")  # still served by db1
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("INSERT INTO shard_1.tags (tag) VALUES ('still writable')")
        held.commit()
    finally:
        held.close()
    report = resume_move(config, 1)
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert -9 in {r[1] for r in rows_of(config.dsn("db3"), "shard_1")}
    assert "still writable" in {r[0] for r in rows_of(config.dsn("db3"), "shard_1", "tags")}
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("how", ["setpriv", "preexec", "neither"])
def test_copy_children_die_with_the_mover(how: str) -> None:
    """pg_dump and psql started by a mover die when it is killed with -9 (setpriv --pdeathsig, or a preexec
    prctl where setpriv is missing), so no copy of theirs goes on behind a dead mover; a child started without it
    outlives its parent, which shows the check can fail."""
    import signal
    import subprocess
    import sys

    from pgidgen.move import transfer

    if how == "setpriv" and transfer._SETPRIV is None:
        pytest.skip("setpriv is not installed")
    script = (
        "import sys, time\n"
        "from pgidgen.move import transfer\n"
        f"if {how!r} == 'preexec': transfer._SETPRIV = None\n"
        f"p = transfer._spawn(['sleep', '60'], dies_with_parent={how != 'neither'})\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        # setpriv sets the death signal, then runs the program: the mover's kill counts from then (a kill in the
        # millisecond before reaches a setpriv not yet armed; seen once in CI under load)
        deadline = time.monotonic() + 10
        while comm(child) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.005)
        assert comm(child) == "sleep"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + (1 if how == "neither" else 10)
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(child) == (how == "neither")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_mover_killed_as_its_child_starts_leaves_no_child(tmp_path: Path) -> None:
    """A mover killed after it started a client program but before setpriv had set the child's death signal: the
    child finds it was orphaned and stops rather than run the program on its own. The window is a millisecond;
    here setpriv is made to start 0.3 s late (a wrapper that sleeps first) and the parent exits the moment Popen
    returns, so it falls inside every time. Without the check the program lived on."""
    import shutil
    import signal
    import subprocess
    import sys

    from pgidgen.move import transfer

    if transfer._SETPRIV is None:
        pytest.skip("setpriv is not installed")
    slow = tmp_path / "slow-setpriv"
    slow.write_text(f"#!/bin/sh\nsleep 0.3\nexec {shutil.which('setpriv')} \"$@\"\n")
    slow.chmod(0o755)
    script = (
        "import os, subprocess\n"
        "from pgidgen.move import transfer\n"
        f"transfer._SETPRIV = {str(slow)!r}\n"
        "p = transfer._spawn(['sleep', '60'], dies_with_parent=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "os.write(1, b'%d\\n' % p.pid)\n"
        "os._exit(0)\n"
    )
    child = int(subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, check=True).stdout)
    try:
        time.sleep(0.3)
        deadline = time.monotonic() + 10
        while alive(child) and comm(child) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # had it run the program, it would be sleeping now
        assert not alive(child), comm(child)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def comm(pid: int) -> str:
    """The program a process runs now (Linux's /proc)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_resume_keeps_the_max_pause_the_move_was_started_with(config: Config, config_file: Path) -> None:
    """`--resume` without --max-pause (as the runbook writes it) bounds the write pause by the move's own
    --max-pause, journaled when it started, not by the default 1s: writers that cannot wait that long would fail."""
    setup_shards(config, rows=10)
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", options=MoveOptions(max_pause=0.2), hook=crash_at("cutover"))
    held = psycopg.connect(config.dsn("db1"))
    try:
        held.execute("INSERT INTO shard_1.t (v) VALUES (-9)")  # a long transaction: the freeze cannot lock the table
        result = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "--resume"])
        assert result.exit_code == 1, result.output
        assert "could not be locked within --max-pause 200 ms" in result.output, result.output
        result = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "--resume", "--max-pause", "300ms"])
        assert "could not be locked within --max-pause 300 ms" in result.output, result.output  # a given one still rules
        # the journal says where and how: another target, or --offline for an online move, is refused, not ignored
        result = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "db2", "--resume"])
        assert result.exit_code == 1 and "Error: shard 1's interrupted move goes to db3, not db2" in result.output, result.output
        result = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "1", "--resume", "--offline"])
        assert result.exit_code == 1 and "Error: shard 1's interrupted move is an online one" in result.output, result.output
        held.commit()
    finally:
        held.close()
    assert resume_move(config, 1).status == "done"
    assert leftovers(config.databases) == []


@pytest.mark.parametrize("point", ["catchup", "cutover:frozen", "activate"])
def test_a_rollback_whose_target_is_gone_undoes_the_source_side(config: Config, tmp_path: Path, point: str) -> None:
    """The target's server is gone for good with a move open: its slot holds WAL on the source (the disk fills)
    and the shard stays 'moving'. --rollback undoes the source side when the source's own rows show the flip has
    not happened (the shard is not retired there), and names what it leaves on the target; after the flip it
    refuses, changing nothing (the target may serve the shard). It needed the target, and failed."""
    from pgidgen.config import write_config

    setup_shards(config, rows=10)
    with pytest.raises(Crash):
        move_shard(config, 1, "db3", hook=crash_at(point))
    target = config.dsn("db3")
    with psycopg.connect(target, autocommit=True) as c:  # as its server's end would: the apply worker stops
        sub = c.execute("SELECT subname FROM pg_subscription").fetchone()[0]  # type: ignore[index]
        c.execute(psycopg.sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(psycopg.sql.Identifier(sub)))
    gone = tmp_path / "gone.toml"
    write_config(gone, config.layout, {**config.databases, "db3": "postgresql://nobody@127.0.0.1:1/none"})
    res = CliRunner().invoke(main, ["--config", str(gone), "move-shard", "1", "--rollback"])
    try:
        if point == "activate":  # the source copy is retired: the flip may have activated the target
            assert res.exit_code == 1 and "Error: db3 does not answer, and shard 1 is retired on db1 already" in res.output, res.output
            assert open_moves(config.dsn("db1")) == 1 and state_of(config.dsn("db1"), 1) is not None
        else:
            assert res.exit_code == 0, res.output
            assert "db1 serves it as before, its slot and publication are dropped; db3 did not answer" in res.output, res.output
            assert sub in res.output
            assert state_of(config.dsn("db1"), 1) == ("active", "shard_1") and open_moves(config.dsn("db1")) == 0
            assert leftovers({"db1": config.dsn("db1")}) == []
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute("INSERT INTO shard_1.t (v) VALUES (-9)")  # served, writable
    finally:  # the target back: what the report names is dropped as it says
        with psycopg.connect(target, autocommit=True) as c:
            name = psycopg.sql.Identifier(sub)
            if point != "activate":
                c.execute(psycopg.sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(name))
                c.execute(psycopg.sql.SQL("DROP SUBSCRIPTION {}").format(name))
                c.execute("DROP SCHEMA IF EXISTS shard_1 CASCADE")
                c.execute("DELETE FROM pgidgen.shards WHERE shard = 1 AND state = 'incoming'")
            else:
                c.execute(psycopg.sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(name))
    if point == "activate":  # with the target back, the rollback it refused runs
        assert rollback_move(config, 1).status == "rolled_back"
        assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")
    assert leftovers(config.databases) == []
