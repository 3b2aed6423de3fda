"""A source whose address accepts the subscription's connection and never answers (a hung server, a proxy or
port that holds connections): the walreceiver's login inside CREATE SUBSCRIPTION heeds no connect_timeout, so
without a bound of pgidgen's own the probe (and the move's own subscription) would wait as long as TCP lets
it, minutes. Both give up after check.login_wait with a one-line error that names the address, and leave nothing."""
from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from movekit import leftovers
from moveshards import Crash, crash_at, journal_statuses, quick_subscription_start, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen.config import Config
from pgidgen.move import move_shard

SECRET = "SilentSecret77"
#: against a hang: the login is given up after check.login_wait (15 s here); the move's checks take a few more
GUARD_S = 120


class Silent:
    """A listener on 127.0.0.1 that accepts every connection, reads nothing and never writes."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port: int = self.listener.getsockname()[1]
        self.came = threading.Event()  # a connection was accepted (a login waits on it)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            self.came.set()

    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=app user=postgres password={SECRET}"

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    source = Silent()
    try:
        yield source
    finally:
        source.close()


def _pgidgen(config_file: Path, *args: str, when: threading.Event | None = None,
             then: Callable[[subprocess.Popen[str]], None] | None = None) -> tuple[int, str]:
    """The CLI as a process of its own, its exit status and its output (stdout and stderr), hang-guarded;
    then(process) is done once when is set."""
    proc = subprocess.Popen([str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if when is not None and then is not None:
            assert when.wait(timeout=GUARD_S), "the source saw no login"
            then(proc)
        out, _ = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"pgidgen {' '.join(args[:3])} still waited after {GUARD_S} s: {out}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


NOTICE = "pgidgen: Ctrl-C: "


def _one_error(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if not ln.startswith(NOTICE)]  # move-shard's notice at a Ctrl-C
    assert len([line for line in lines if line.startswith("Error:")]) == 1 and len(lines) == 1, out
    assert "Traceback" not in out and SECRET not in out, out
    return lines[0]


def test_the_probe_gives_up_on_a_source_that_never_answers(config: Config, config_file: Path, silent: Silent) -> None:
    """move-shard's reach check: refused before anything is journaled, with the silent address and what to check."""
    setup_shards(config, rows=10)
    code, out = _pgidgen(config_file, "move-shard", "1", "db2", "--subscription-dsn", silent.dsn())
    assert code == 1, out
    line = _one_error(out)
    assert re.match(rf"Error: the server's login to db1 as a subscription timed out: the source at 127\.0\.0\.1:{silent.port}"
                    r" did not answer the login within \d+ s .*\(db2\): .*--subscription-dsn", line), line
    assert leftovers(config.databases) == []
    assert journal_statuses(config.databases) == {}
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")


def test_the_moves_subscription_gives_up_on_a_source_that_never_answers(config: Config, config_file: Path, silent: Silent) -> None:
    """The move's own CREATE SUBSCRIPTION (a resume given a --subscription-dsn the probe never saw): the step
    fails with the address, the journal says failed, and a rollback leaves nothing."""
    setup_shards(config, rows=10)
    with pytest.raises(Crash):
        move_shard(config, 1, "db2", hook=crash_at("subscription"))
    code, out = _pgidgen(config_file, "move-shard", "1", "--resume", "--subscription-dsn", silent.dsn())
    assert code == 1, out
    line = _one_error(out)
    assert re.match(rf"Error: database db2 could not subscribe to db1: the source at 127\.0\.0\.1:{silent.port} did not answer the login within \d+ s ",
                    line), line
    assert journal_statuses(config.databases) == {"failed": 1}
    assert [x for x in leftovers(config.databases) if "subscription" in x] == []
    code, out = _pgidgen(config_file, "move-shard", "1", "--rollback")
    assert code == 0, out
    assert leftovers(config.databases) == []
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1")


def _cancel_the_login(config: Config) -> Callable[[subprocess.Popen[str]], None]:
    """A cancel from outside pgidgen (a DBA's pg_cancel_backend) of the target's statement waiting for the login."""
    def cancel(_: subprocess.Popen[str]) -> None:
        with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
            for _ in range(200):
                if c.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgidgen'"
                             " AND state = 'active' AND query LIKE 'DO %'").fetchall():
                    return
                time.sleep(0.05)
        pytest.fail("no statement waiting for the login on db2")

    return cancel


@pytest.mark.parametrize("how", ["ctrl-c probe", "ctrl-c subscription", "pg_cancel_backend probe"])
def test_a_cancel_while_the_login_waits_is_an_interrupt(config: Config, config_file: Path, silent: Silent, how: str) -> None:
    """A Ctrl-C while the target's server waits for the silent source's answer, or a cancel of that statement
    from outside. At the probe, before anything is written, a Ctrl-C stops the move there and then (the probe
    cancelled), and an outside cancel ends the statement with the same SQLSTATE as the timeout (57014) but is still
    reported as a cancel, not as a source that did not answer (the DO block's own test). On a resume the move is in
    flight: a Ctrl-C lets it go on (move-shard finishes the batch in flight), so its subscription gives up on its
    own bound and the step fails, journaled, for --resume or --rollback."""
    setup_shards(config, rows=10)
    args = ["move-shard", "1", "db2"]
    if "subscription" in how:
        with pytest.raises(Crash):
            move_shard(config, 1, "db2", hook=crash_at("subscription"))
        args = ["move-shard", "1", "--resume"]
    then = (lambda proc: proc.send_signal(signal.SIGINT)) if "ctrl-c" in how else _cancel_the_login(config)
    code, out = _pgidgen(config_file, *args, "--subscription-dsn", silent.dsn(), when=silent.came, then=then)
    assert code == 1, out
    line = _one_error(out)
    expected = {"ctrl-c probe": "Error: move-shard interrupted during its checks: nothing was written; run 'pgidgen ",
                "ctrl-c subscription": "Error: database db2 could not subscribe to db1: the source at ",
                "pg_cancel_backend probe": "Error: cancelled while the target's server was connecting to the source; nothing was created"}[how]
    assert line.startswith(expected), line
    if how == "ctrl-c probe":
        assert NOTICE in out and "move-shard 1 db2 --subscription-dsn" in line and SECRET not in line, out
    assert [x for x in leftovers(config.databases) if "subscription" in x] == []
    assert journal_statuses(config.databases) == ({"failed": 1} if "subscription" in how else {})


@pytest.mark.parametrize("password", ["'q7 z'", "q7z"])
def test_the_command_a_ctrl_c_prints_shows_no_password_and_stays_one_shell_word(
    config: Config, config_file: Path, silent: Silent, password: str,
) -> None:
    """The command an interrupted move-shard prints to move the rest carries --subscription-dsn with its password
    taken out: a quoted one (spaces allowed) and one too short to be scrubbed by its value alone included; the
    connection string stays one shell word (the command can be pasted once the password is put back)."""
    setup_shards(config, rows=10)
    dsn = silent.dsn().replace(f"password={SECRET}", f"password={password}")
    code, out = _pgidgen(config_file, "move-shard", "1", "db2", "--subscription-dsn", dsn, when=silent.came,
                         then=lambda proc: proc.send_signal(signal.SIGINT))
    assert code == 1, out
    line = _one_error(out)
    assert "q7" not in out, out
    command = re.search(r"run '(.+)' to move shard 1$", line)
    assert command is not None, line
    words = shlex.split(command.group(1))
    assert words[-2:] == ["--subscription-dsn", dsn.replace(f"password={password}", "password=***")], words
    assert journal_statuses(config.databases) == {}


def test_the_refusal_names_the_source_as_its_connection_string_does() -> None:
    """The timeout's refusal says where the login went: host:port (each of a list), never a password; a string
    that names a service file's entry and no host names the entry (its host is in that file, on the target's
    server), not a localhost:5432 it never used."""
    from pgidgen.check import address

    assert address("host=10.0.0.5 port=6432 password=secret user=u") == "10.0.0.5:6432"
    assert address("host=a,b port=5433") == "a:5433,b:5433"
    assert address("dbname=x") == "localhost:5432"
    assert address("service=src dbname=x") == "service src"
    assert address("service=src port=6000") == "service src (port 6000)"
    assert address("service=src host=h") == "h:5432"
