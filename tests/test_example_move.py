"""The example app across a real `pgidgen move-shard` (pgidgen.move): a writer keeps writing while its shard
moves; every photo is found afterwards, on the new database, and nothing was written to the retired copy."""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_example import photos

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move import move_shard
from pgidgen.routing import Router

SHARDS = 8
USER = 13  # shard 5, on db2 of db1/db2


@pytest.fixture
def app(config: Config) -> Any:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    assert all(o.ok for o in photos.create_tables(config))
    with Router(config, retry_for=20.0) as router:
        yield photos.PhotoApp(router)


def test_the_app_keeps_working_across_move_shard(app: Any, config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    shard = USER % SHARDS
    first = app.add_photo(USER, "before the move")
    app.like(first, 2)
    result: dict[str, Any] = {}
    writer = threading.Thread(target=lambda: result.setdefault("rc", photos.cmd_write(app, USER, 4.0)))
    writer.start()
    time.sleep(1.0)
    report = move_shard(config, shard, "db3")
    writer.join(60)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rc"] == 0, summary
    assert summary["database_before"] == "db2" and summary["database_after"] == "db3", summary
    assert summary["missing"] == 0 and summary["duplicates"] == 0 and summary["increasing"] and summary["written"] > 0
    assert app.router.database_for(shard) == "db3"
    assert app.likers(first) == [2]
    retired = report.retired_schema
    assert retired
    with psycopg.connect(config.dsn("db2")) as old, psycopg.connect(config.dsn("db3")) as new:
        old_ids = {r[0] for r in old.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(retired, "photos")))}
        new_ids = {r[0] for r in new.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(f"shard_{shard}", "photos")))}
    assert old_ids <= new_ids  # the old copy holds only what was written before the flip, all of it carried over
    after = app.add_photo(USER, "after the move")
    assert after in {p.id for p in app.photos_of(USER, limit=100000)} and after > max(new_ids)
