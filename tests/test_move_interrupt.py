"""Ctrl-C during `pgidgen move-shard` of a set, as a terminal sends it: SIGINT to the whole foreground process group
(twice). The batch in flight finishes, no other starts, nothing is left half-done, and the command the error line
names moves the rest."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from movekit import Writer, leftovers
from moveshards import (  # noqa: F401 (quick_subscription_start: an autouse fixture)
    CLIENTS,
    children,
    ctrl_c_in_flight,
    ended,
    journal_statuses,
    nothing_half_done,
    pgidgen,
    quick_subscription_start,
    rows_of,
    setup_on_one,
    setup_shards,
    writers_saw_nothing_lost,
)

from pgidgen.config import Config
from pgidgen.move import batches as batches_
from pgidgen.move import plan_shards
from pgidgen.ranges import collapse
from pgidgen.shardmap import read_map

pytestmark = pytest.mark.sensitive  # replication workers and signals differ between majors: runs on every one

SHARDS = 40  # all on db1, moved to db2 in several batches (by their estimated pause)
PAUSE_PER_SHARD = 0.045  # an estimate that cuts them into batches of about ten


def test_ctrl_c_during_move_shard_finishes_the_batch_in_flight_and_the_printed_command_moves_the_rest(
    config: Config, config_file: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batches_, "PAUSE_PER_SHARD_S", PAUSE_PER_SHARD)  # the plan below, as the process cuts it
    setup_on_one(config, SHARDS, rows=50)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:  # a table too large to come through pgidgen: a psql streams it
        c.execute("CREATE TABLE shard_0.big (id int PRIMARY KEY, note text)")
        c.execute("INSERT INTO shard_0.big SELECT g, md5(g::text) FROM generate_series(1, 30000) g")
    batches = plan_shards(config, range(SHARDS), "db2")
    assert len(batches) >= 3, [b.shards for b in batches]
    # writers on a shard of the first batch (in flight at the Ctrl-C) and one of the last (moved by the second run)
    watched = [0, SHARDS - 1]
    assert SHARDS - 1 not in batches[0].shards
    before = {s: rows_of(config.dsn("db1"), f"shard_{s}") for s in watched}
    writers = {s: Writer(config.databases, s) for s in watched}
    for w in writers.values():
        w.start()
    try:
        proc = pgidgen(config_file, "move-shard", f"0-{SHARDS - 1}", "db2", pause_per_shard=PAUSE_PER_SHARD)
        caught, twice, out, err = ctrl_c_in_flight(proc, config, twice=True)  # the first batch; and again: it still finishes
        assert caught, f"the first batch ended before it was seen in flight with a client program running:\n{err}"
        assert twice, f"the first batch ended before the second Ctrl-C:\n{err}"
        assert proc.returncode == 1, (proc.returncode, out, err)
        assert "Traceback" not in err, err
        on = nothing_half_done(config, SHARDS)
        moved = sorted(on.get("db2", []))
        assert 0 < len(moved) < SHARDS, f"the Ctrl-C stopped the move part-way: {len(moved)} of {SHARDS} moved; caught {caught}, output:\n{err}"
        assert 0 in moved and SHARDS - 1 not in moved
        errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1, err
        assert [ln for ln in err.splitlines() if ln not in errors] == [
            "pgidgen: Ctrl-C: finishing the batch in flight, then stopping (a second Ctrl-C does not cut it short)"], err
        assert out.startswith(f"moved shards 0-{moved[-1]} from db1 to db2"), out  # the report of the batch that finished
        left = list(range(moved[-1] + 1, SHARDS))
        again = f"pgidgen --config {shlex.quote(str(config_file))} move-shard {collapse(left)} db2"
        assert errors[0] == (f"Error: move-shard interrupted: {len(moved)} of {SHARDS} shards moved to db2 (the batch in flight finished"
                             f" or rolled back, no other started); shard{'s' if len(left) > 1 else ''} {collapse(left)} did not move:"
                             f" run '{again}' to move the rest"), errors
        # the command it names moves the rest
        words = shlex.split(re.search(r"run '(.+)' to move the rest$", errors[0]).group(1))  # type: ignore[union-attr]
        rest = subprocess.run([str(Path(sys.executable).parent / "pgidgen"), *words[1:]], capture_output=True, text=True, timeout=600)
        assert rest.returncode == 0, (rest.stdout, rest.stderr)
    finally:
        for w in writers.values():
            w.stop()
    m = read_map(config)
    assert m.ok and sorted(m.databases["db2"]) == list(range(SHARDS)) and not m.databases.get("db1"), m.databases
    assert set(journal_statuses(config.databases)) <= {"done"} and leftovers(config.databases) == []
    writers_saw_nothing_lost(config, writers, before)


def test_a_ctrl_c_whose_notice_cannot_be_written_still_lets_the_batch_in_flight_finish(config: Config, config_file: Path) -> None:
    """`pgidgen move-shard ... 2>&1 | tee log`: the terminal's Ctrl-C ends tee too, so the notice pgidgen writes at
    the Ctrl-C meets a closed pipe. That must not end pgidgen with the batch in flight cut short (its moves run on
    a daemon thread, which dies with the process): the batch still finishes, and nothing is left half-done."""
    setup_on_one(config, 4, rows=50)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:  # a table large enough for a Ctrl-C in flight
        c.execute("CREATE TABLE shard_0.big (id int PRIMARY KEY, note text)")
        c.execute("INSERT INTO shard_0.big SELECT g, md5(g::text) FROM generate_series(1, 30000) g")
    proc = pgidgen(config_file, "move-shard", "0-3", "db2")
    assert proc.stderr is not None
    proc.stderr.close()  # as tee's end of the pipe, gone with the Ctrl-C
    sent = False
    try:
        while proc.poll() is None:
            if [k for k in children(proc.pid) if k[1] in CLIENTS] and journal_statuses(config.databases).get("running"):
                os.killpg(proc.pid, signal.SIGINT)
                sent = True
                break
            time.sleep(0.001)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent, "the batch ended before it was seen in flight with a client program running"
    assert journal_statuses(config.databases).get("running") is None, journal_statuses(config.databases)
    nothing_half_done(config, 4)
    assert out.startswith("moved shards 0-3 from db1 to db2"), out  # the batch in flight (the only one) finished


def test_a_ctrl_c_while_a_batch_that_did_not_fit_is_rolled_back_does_not_say_nothing_was_written(config: Config, config_file: Path) -> None:
    """Shard 3's table is locked, so the batch's cutover cannot fit --max-pause: the batch is rolled back (its
    move journaled rolled_back) to be moved as halves, and the Ctrl-C that came while it was in flight stops
    the halves. No shard moved, but something was done: the error line is not the one of a Ctrl-C during the
    first batch's checks ("nothing was written")."""
    setup_shards(config, rows=20)  # 0-3 on db1
    with psycopg.connect(config.dsn("db1")) as blocker:
        blocker.execute("LOCK TABLE shard_3.tags IN ROW EXCLUSIVE MODE")
        proc = pgidgen(config_file, "move-shard", "0-3", "db3")
        try:
            while proc.poll() is None and not journal_statuses(config.databases).get("running"):
                time.sleep(0.005)
            os.killpg(proc.pid, signal.SIGINT)
        except BaseException:
            ended(proc, 0)
            raise
        out, err = ended(proc)
        blocker.rollback()
    assert proc.returncode == 1, (out, err)
    assert journal_statuses(config.databases) == {"rolled_back": 1}, err
    [error] = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert error.startswith("Error: move-shard interrupted: 0 of 4 shards moved to db3 (the batch in flight finished or rolled back,"), err
    assert "shards 0-3 did not move: run 'pgidgen --config" in error and "move-shard 0-3 db3' to move the rest" in error, error
    assert leftovers(config.databases) == []
