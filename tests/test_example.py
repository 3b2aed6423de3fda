"""The example app (examples/photos.py, examples/schema.sql) against real servers, also across a move."""
from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from test_routing import hand_move

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.routing import Router

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 16


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("photos_example", ROOT / "examples" / "photos.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["photos_example"] = mod
    spec.loader.exec_module(mod)
    return mod


photos = load_example()


@pytest.fixture
def app(config: Config) -> Any:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    assert [o.details["applied"] for o in photos.create_tables(config)] == [8, 8, 0]
    with Router(config, retry_for=10.0) as router:
        yield photos.PhotoApp(router)


def test_tables_are_created_unqualified_in_every_shard_with_its_own_next_id(app: Any, config: Config) -> None:
    with psycopg.connect(config.dsn("db2")) as conn:
        default = conn.execute(
            "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid"
            " WHERE c.oid = 'shard_13.photos'::regclass AND d.adnum = 1"
        ).fetchone()
    assert default == ("shard_13.next_id()",)


def test_photos_likes_and_lookups(app: Any) -> None:
    r = app.router
    start = dt.datetime.now(dt.timezone.utc)
    mine = [app.add_photo(21, f"p{i}") for i in range(3)]
    other = app.add_photo(22, "someone else's")
    assert [r.shard_of(i) for i in mine] == [21 % SHARDS] * 3 and r.shard_of(other) == 22 % SHARDS
    assert r.database_for(21 % SHARDS) == "db1" and r.database_for(22 % SHARDS) == "db1"
    listed = app.photos_of(21)
    assert [p.id for p in listed] == sorted(mine, reverse=True)  # newest first by ID alone
    assert all(p.user_id == 21 for p in listed)
    p = app.photo(mine[1])
    assert p is not None and p.caption == "p1" and p.user_id == 21
    assert app.photo(r.layout.encode(r.layout.epoch_ms + 1, 21 % SHARDS, 0)) is None  # never made
    assert app.like(mine[0], 7) and app.like(mine[0], 30) and not app.like(mine[0], 7)
    assert app.likers(mine[0]) == [7, 30]
    until = app.id_time(mine[1])
    expected = [x for x in reversed(listed) if app.id_time(x.id) <= until]  # mine[0], mine[1] (and mine[2] if the same ms)
    assert app.photos_between(21, start, until) == expected and [x.id for x in expected][:2] == mine[:2]
    assert app.photos_between(21, app.id_time(mine[2]) + dt.timedelta(milliseconds=1), dt.datetime.now(dt.timezone.utc)) == []
    assert app.add_photo(40, "on db2") and r.database_for(40 % SHARDS) == "db2"


def test_the_command_line_demo(config: Config, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert all(o.ok for o in init(config, SHARDS, ["db1"]))
    assert photos.main(["--config", str(config_file), "setup"]) == 0
    assert capsys.readouterr().out.startswith("db1: applied schema.sql (#1) to 16 shards (0-15)\n")
    assert photos.main(["--config", str(config_file), "demo", "--users", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("user 1: shard 1 on db1, photo IDs [") and out[1].startswith("user 2: shard 2 on db1")
    assert "by ID alone: shard 1 on db1: 'photo 1 of user 1' by user 1" in out[2]
    assert out[3].endswith("is liked by users [2, 3]")
    first_ids = out[0].split("photo IDs ")[1].strip("[]").split(", ")
    assert out[5].split(": ")[-1].strip("[]").split(", ")[:2] == first_ids[:2]  # from the first photo up to the second's time
    assert photos.main(["--config", str(config_file), "show", "--user", "1"]) == 0
    assert capsys.readouterr().out.startswith("user 1: shard 1 on db1, 3 photos, newest ")
    assert photos.main(["--config", str(tmp_missing(config_file)), "show", "--user", "1"]) == 1
    assert "Error: config file" in capsys.readouterr().err


def tmp_missing(path: Path) -> Path:
    return path.with_name("missing.toml")


def test_the_app_keeps_writing_across_a_move(app: Any, config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    """A writer for user 5 (shard 5, db1) runs while shard 5 moves to db3 by hand; every photo is found after."""
    first = app.add_photo(5, "before")
    app.like(first, 9)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", photos.cmd_write(app, 5, 2.0)))
    t.start()
    time.sleep(0.5)
    hand_move(config, 5, "db1", "db3", ddl=photos.SCHEMA_FILE.read_text(), tables=("photos", "likes"), between=lambda: time.sleep(0.1))
    t.join(30)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rc"] == 0, summary
    assert summary["database_before"] == "db1" and summary["database_after"] == "db3"
    assert summary["missing"] == 0 and summary["duplicates"] == 0 and summary["increasing"] and summary["written"] > 0
    assert app.likers(first) == [9]
    assert app.router.database_for(5) == "db3"
