"""Ctrl-C during `pgidgen move-shard --rollback`, as a terminal sends it (SIGINT to the process group, twice): the
rollback runs on a thread of its own and finishes; it is never left half-undone by a KeyboardInterrupt landing
inside one of its steps."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from moveshards import ended, journal_statuses, nothing_half_done, setup_on_one, wait_stopped

from pgidgen.config import Config


def test_ctrl_c_during_a_rollback_lets_it_finish(config: Config, config_file: Path) -> None:
    setup_on_one(config, 2, rows=50)
    env = dict(os.environ, PGIDGEN_MOVE_STOP_AT="catchup")
    cli = [str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), "move-shard"]
    crashed = subprocess.Popen([*cli, "1", "db2"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_stopped(crashed)  # the copy is on db2, the subscription streams: a move to undo
    crashed.kill()
    ended(crashed)
    assert journal_statuses(config.databases) == {"running": 1}
    # the rollback stops for a while right after its teardown, the window of the Ctrl-C
    env = dict(os.environ, PGIDGEN_MOVE_STOP_AT="rollback:torn-down", PGIDGEN_MOVE_STOP_FOR="1.5")
    proc = subprocess.Popen([*cli, "--rollback", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        wait_stopped(proc)
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        out, err = ended(proc, 120)
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "Traceback" not in err and "finishing the rollback" in err, err
    assert "rolled back" in out.lower() or "rolled_back" in out, out
    assert journal_statuses(config.databases) == {"rolled_back": 1}
    on = nothing_half_done(config, 2)
    assert sorted(on["db1"]) == [0, 1] and not on.get("db2"), on
