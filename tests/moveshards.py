"""What the move tests share: shards with rows on two databases, their state, the CLI run as a child process."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move.journal import ONLINE_STEPS

SHARDS = 8  # db1: 0-3, db2: 4-7, db3: none


@pytest.fixture(scope="module", autouse=True)
def quick_subscription_start(pg_servers: list[Any]) -> None:
    """PostgreSQL 15's launcher starts at most one subscription worker per wal_retrieve_retry_interval (5 s):
    tests that create subscriptions back to back would mostly wait for it."""
    for s in pg_servers:
        try:
            with psycopg.connect(s.dsn, autocommit=True) as c:
                c.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'")
                c.execute("SELECT pg_reload_conf()")
        except psycopg.Error:
            pass


def setup_shards(config: Config, *, rows: int = 200, databases: tuple[str, ...] = ("db1", "db2")) -> None:
    outcomes = init(config, SHARDS, list(databases))
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    with psycopg.connect(config.dsn(databases[0]), autocommit=True) as c:
        for shard in range(0, SHARDS // len(databases)):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), v int, note text)")
            c.execute(f"CREATE TABLE shard_{shard}.tags (tag text PRIMARY KEY, n serial)")
            c.execute(f"INSERT INTO shard_{shard}.t (v, note) SELECT g, md5(g::text) FROM generate_series(1, {rows}) g")
            c.execute(f"INSERT INTO shard_{shard}.tags (tag) SELECT 'tag' || g FROM generate_series(1, 10) g")


def setup_on_one(config: Config, count: int, *, rows: int = 20) -> None:
    """count shards, all on db1, each with the two tables of setup_shards: rebalance's starting point."""
    assert all(o.ok for o in init(config, count, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for s in range(count):
            c.execute(f"CREATE TABLE shard_{s}.t (id bigint PRIMARY KEY DEFAULT shard_{s}.next_id(), v int, note text)")
            c.execute(f"CREATE TABLE shard_{s}.tags (tag text PRIMARY KEY, n serial)")
            c.execute(f"INSERT INTO shard_{s}.t (v, note) SELECT g, md5(g::text) FROM generate_series(1, {rows}) g")


def rows_of(dsn: str, schema: str, table: str = "t") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(f"SELECT * FROM {schema}.{table} ORDER BY 1").fetchall()


def state_of(dsn: str, shard: int) -> tuple[str, str] | None:
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.execute("SELECT to_regclass('pgidgen.shards')").fetchone()[0] is None:
            return None
        row = c.execute("SELECT state, schema_name FROM pgidgen.shards WHERE shard = %s", (shard,)).fetchone()
        return (row[0], row[1]) if row else None


def open_moves(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return int(c.execute("SELECT count(*) FROM pgidgen.moves WHERE status IN ('running', 'failed')").fetchone()[0])


def journal_statuses(dsns: dict[str, str]) -> dict[str, int]:
    """How many journaled moves of each status (running, failed, done, rolled_back) all these databases hold."""
    out: dict[str, int] = {}
    for dsn in dsns.values():
        with psycopg.connect(dsn, autocommit=True) as c:
            if c.execute("SELECT to_regclass('pgidgen.moves')").fetchone()[0] is None:
                continue
            for status, n in c.execute("SELECT status, count(*) FROM pgidgen.moves GROUP BY 1"):
                out[status] = out.get(status, 0) + int(n)
    return out


#: The client programs pgidgen runs (setpriv: as the servers' user, in the tests).
CLIENTS = ("pg_dump", "pg_restore", "psql", "setpriv")


def children(pid: int) -> list[tuple[int, str]]:
    """The live child processes of pid (of any of its threads), with their program names."""
    found = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids = f.read_text().split()
        except OSError:
            continue
        for c in pids:
            try:
                stat = Path(f"/proc/{c}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                found.append((int(c), stat[stat.index("(") + 1:stat.rindex(")")]))
    return found


def serving(config: Config) -> dict[int, list[str]]:
    """shard -> the databases whose catalog has it active."""
    out: dict[int, list[str]] = {}
    for name, dsn in config.databases.items():
        with psycopg.connect(dsn, autocommit=True) as c:
            if c.execute("SELECT to_regclass('pgidgen.shards')").fetchone()[0] is None:  # type: ignore[index]
                continue
            for (s,) in c.execute("SELECT shard FROM pgidgen.shards WHERE state = 'active'"):
                out.setdefault(int(s), []).append(name)
    return out


def pgidgen(config_file: Path, *args: str, pause_per_shard: float | None = None) -> subprocess.Popen[str]:
    """pgidgen in a process group of its own (its pid is the group's id), as a shell runs a foreground job: the
    group's SIGINT is a Ctrl-C. pause_per_shard: the batches' estimate of a shard's pause (batches.PAUSE_PER_SHARD_S),
    for a test that needs a few shards cut into several batches."""
    argv = [str(Path(sys.executable).parent / "pgidgen")]
    if pause_per_shard is not None:
        argv = [sys.executable, "-c", "import sys; from pgidgen.move import batches; from pgidgen.cli import main;"
                f" batches.PAUSE_PER_SHARD_S = {pause_per_shard!r}; sys.argv[0] = 'pgidgen'; main()"]
    return subprocess.Popen([*argv, "--config", str(config_file), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def ctrl_c_in_flight(proc: subprocess.Popen[str], config: Config, *, twice: bool = False) -> tuple[list[tuple[int, str]], bool, str, str]:
    """SIGINT to proc's process group (what Ctrl-C in a terminal does) once its first batches are in flight with
    a client program running (journaled running, none done yet), and with twice a second one while a batch is
    still running; then proc's end. The client programs seen at the first ([] if proc ended before), whether the
    second was sent, and proc's stdout and stderr."""
    caught: list[tuple[int, str]] = []
    again = False
    try:
        while proc.poll() is None:
            kids = [k for k in children(proc.pid) if k[1] in CLIENTS]
            if kids and (st := journal_statuses(config.databases)).get("running") and not st.get("done"):
                os.killpg(proc.pid, signal.SIGINT)
                caught = kids
                break
            time.sleep(0.001)
        if twice and caught:
            time.sleep(0.01)
            again = bool(journal_statuses(config.databases).get("running"))
            if again:
                os.killpg(proc.pid, signal.SIGINT)
    except BaseException:
        ended(proc, 0)
        raise
    out, err = ended(proc)
    return caught, again, out, err


def ended(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[str, str]:
    """proc's stdout and stderr once it ends; killed once timeout has passed (0: at once)."""
    try:
        return proc.communicate(timeout=timeout or 0.001)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def nothing_half_done(config: Config, shards: int) -> dict[str, list[int]]:
    """After an interrupted move: every journaled move finished or rolled back, no slot, publication or
    subscription left, every shard active in exactly one database and the map agrees; the map's databases."""
    from movekit import leftovers

    from pgidgen.shardmap import read_map

    assert set(journal_statuses(config.databases)) <= {"done", "rolled_back"}, journal_statuses(config.databases)
    assert leftovers(config.databases) == []
    held = serving(config)
    assert sorted(held) == list(range(shards)) and all(len(v) == 1 for v in held.values()), held
    m = read_map(config)
    assert m.ok and {s: [n] for n, on in m.databases.items() for s in on} == held
    return m.databases


def writers_saw_nothing_lost(config: Config, writers: dict[int, Any], before: dict[int, list[tuple[Any, ...]]]) -> None:
    """Each movekit.Writer's shard, wherever it lives now: every acknowledged ID once, rising, and no row lost or
    duplicated against the rows it had before."""
    for s, w in writers.items():
        [where] = serving(config)[s]
        ids = [r[0] for r in rows_of(config.dsn(where), f"shard_{s}")]
        assert len(w.ids) > 0 and len(set(w.ids)) == len(w.ids), f"shard {s}: an ID acknowledged twice"
        assert w.ids == sorted(w.ids), f"shard {s}: IDs after its move are not greater than those before"
        assert sorted(ids) == sorted([r[0] for r in before[s]] + w.ids), f"shard {s}: rows lost or duplicated"


def start_cli(config_file: Path, *args: str, stop_at: str | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if stop_at:
        env["PGIDGEN_MOVE_STOP_AT"] = stop_at
    return subprocess.Popen([str(Path(sys.executable).parent / "pgidgen"), "--config", str(config_file), "move-shard", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_stopped(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("pgidgen: stopped at"), line + (proc.stderr.read() if proc.poll() is not None else "")


def our_children(name: str) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if comm == name and int(rest[1]) == os.getpid() and rest[0] != "Z":  # a zombie has finished
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def no_bytes(output: str) -> list[str]:
    """Output lines without the sizes in them (", 96 kB", " (48 kB)"): they differ between PostgreSQL majors; and
    without a batch's estimated pause (", estimated write pause 56 ms") and a dry run's estimated time and pause
    ("about 3 s", "up to 56 ms": "about N s", "up to N ms"), which follow the cost constants."""
    lines = [re.sub(r",? \(?[0-9.]+ (bytes|kB|MB|GB)\)?|, estimated write pause [0-9]+ ms", "", line) for line in output.splitlines()]
    return [re.sub(r"about [0-9]+ s", "about N s", re.sub(r"up to [0-9]+ ms", "up to N ms", line)) for line in lines]


#: Where a move can be stopped: before each step, and inside the copy and the pause.
POINTS = [*ONLINE_STEPS, "copy:restored", "cutover:frozen"]


class Crash(Exception):
    pass


def crash_at(point: str):  # type: ignore[no-untyped-def]
    def hook(where: str) -> None:
        if where == point:
            raise Crash(point)

    return hook

