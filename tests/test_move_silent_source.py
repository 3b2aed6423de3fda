"""A source whose address accepts the subscription's connection and never answers (a hung server, a proxy or
port that holds connections): the walreceiver's login inside CREATE SUBSCRIPTION heeds no connect_timeout, so
without a bound of pgidgen's own the probe (and the move's own subscription) would wait as long as TCP lets
it, minutes. Both give up after check.login_wait with a one-line error that names the address, and leave nothing."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
from movekit import leftovers
from moveshards import Crash, crash_at, journal_statuses, quick_subscription_start, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen.config import Config
from pgidgen.move import move_shard

SECRET = "SilentSecret77"
#: against a hang: the login is given up after check.login_wait (15 s here); the move's checks take a few more
GUARD_S = 120


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener on 127.0.0.1 that accepts every connection, reads nothing and never writes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        listener.close()
        thread.join(timeout=5)
        for conn in held:
            conn.close()


def _pgidgen(config_file: Path, *args: str) -> tuple[int, str]:
    """The CLI as a process of its own, its exit status and its output (stdout and stderr), hang-guarded."""
    proc = subprocess.Popen([str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"pgidgen {' '.join(args[:3])} still waited after {GUARD_S} s: {out}")
    return proc.returncode, out


def _one_error(out: str) -> str:
    lines = out.strip().splitlines()
    assert len([line for line in lines if line.startswith("Error:")]) == 1 and len(lines) == 1, out
    assert "Traceback" not in out and SECRET not in out, out
    return lines[0]


def test_the_probe_gives_up_on_a_source_that_never_answers(config: Config, config_file: Path, silent_port: int) -> None:
    """move-shard's reach check: refused before anything is journaled, with the silent address and what to check."""
    setup_shards(config, rows=10)
    dsn = f"host=127.0.0.1 port={silent_port} dbname=app user=postgres password={SECRET}"
    code, out = _pgidgen(config_file, "move-shard", "1", "db2", "--subscription-dsn", dsn)
    assert code == 1, out
    line = _one_error(out)
    assert re.match(rf"Error: the server's login to db1 as a subscription timed out: the source at 127\.0\.0\.1:{silent_port}"
                    r" did not answer the login within \d+ s .*\(db2\): .*--subscription-dsn", line), line
    assert leftovers(config.databases) == []
    assert journal_statuses(config.databases) == {}
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")


def test_the_moves_subscription_gives_up_on_a_source_that_never_answers(config: Config, config_file: Path, silent_port: int) -> None:
    """The move's own CREATE SUBSCRIPTION (a resume given a --subscription-dsn the probe never saw): the step
    fails with the address, the journal says failed, and a rollback leaves nothing."""
    setup_shards(config, rows=10)
    with pytest.raises(Crash):
        move_shard(config, 1, "db2", hook=crash_at("subscription"))
    dsn = f"host=127.0.0.1 port={silent_port} dbname=app user=postgres password={SECRET}"
    code, out = _pgidgen(config_file, "move-shard", "1", "--resume", "--subscription-dsn", dsn)
    assert code == 1, out
    line = _one_error(out)
    assert re.match(rf"Error: database db2 could not subscribe to db1: the source at 127\.0\.0\.1:{silent_port} did not answer the login within \d+ s ",
                    line), line
    assert journal_statuses(config.databases) == {"failed": 1}
    assert [x for x in leftovers(config.databases) if "subscription" in x] == []
    code, out = _pgidgen(config_file, "move-shard", "1", "--rollback")
    assert code == 0, out
    assert leftovers(config.databases) == []
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")
