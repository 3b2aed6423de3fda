"""pgidgen.integrations against real servers with the real libraries, each while `move-shard` moves the shard it
writes to: no exception reaches the application, nothing is lost, nothing is duplicated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move import move_shard

from moveshards import quick_subscription_start  # noqa: F401 - a fixture: moves on PostgreSQL 15

SHARDS = 4  # db1: 0-1, db2: 2-3, db3: none (the target)
SHARD = 1
HERE = Path(__file__).resolve().parent


@pytest.fixture
def sharded(config: Config) -> Config:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for shard in (0, 1):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), v int NOT NULL)")
        c.execute("INSERT INTO shard_1.t (v) SELECT g FROM generate_series(1, 50) g")
    return config


def move(config: Config) -> None:
    report = move_shard(config, SHARD, "db3")
    assert report.status == "done" and report.verification is not None and report.verification.ok


def assert_all_there(config: Config, ids: list[int], errors: list[str]) -> None:
    assert errors == []
    with psycopg.connect(config.dsn("db3")) as c:
        stored = [r[0] for r in c.execute("SELECT id FROM shard_1.t WHERE id = ANY(%s)", (ids,))]
        total = c.execute("SELECT count(*) FROM shard_1.t").fetchone()[0]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)  # nothing duplicated
    assert sorted(stored) == sorted(ids) and total == 50 + len(ids)  # nothing lost, nothing else


def test_django_writer_during_a_move(sharded: Config, config_file: Path) -> None:
    pytest.importorskip("django")
    env = {**os.environ, "PGIDGEN_CONFIG": str(config_file)}
    app = subprocess.Popen([sys.executable, str(HERE / "django_app.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert app.stdout is not None and app.stdin is not None
        line = app.stdout.readline()
        assert line == "ready\n", line + (app.stderr.read() if app.stderr else "")
        move(sharded)
        app.stdin.write("moved\n")
        app.stdin.flush()
        out, err = app.communicate(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    assert result["database"] == "db3"
    assert_all_there(sharded, result["ids"], result["errors"])
