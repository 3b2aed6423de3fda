"""examples/photos_async.py (AsyncRouter) across a real `pgidgen move-shard`: concurrent writers for several users
keep writing while one user's shard moves; nothing reaches them, nothing is lost or written twice."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from moveshards import quick_subscription_start  # noqa: F401 - autouse: 15's launcher starts subscriptions at once
from test_example import photos

from pgidgen.config import Config, write_config
from pgidgen.init import init
from pgidgen.move import move_shard

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 8
USERS = 4  # users 11-14: shards 3-6; user 13's shard 5 is on db2 of db1/db2, and moves to db3


def test_async_writers_keep_working_across_move_shard(config: Config, tmp_path: Path) -> None:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    assert all(o.ok for o in photos.create_tables(config))
    path = tmp_path / "pgidgen.toml"
    write_config(path, config.layout, config.databases)
    example = ROOT / "examples" / "photos_async.py"
    writer = subprocess.Popen([sys.executable, str(example), "--config", str(path), "write", "--users", str(USERS),
                               "--first-user", "11", "--seconds", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    moved: dict[str, object] = {}
    time.sleep(1.5)  # the move starts 1.5 s into the writers' 16 s (a loaded CI machine's move took over 6 s)
    mover = threading.Thread(target=lambda: moved.setdefault("report", move_shard(config, 13 % SHARDS, "db3")))
    mover.start()
    out, err = writer.communicate(timeout=120)
    mover.join(60)
    assert writer.returncode == 0, out + err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["errors"] == [] and summary["missing"] == 0 and summary["duplicates"] == 0 and summary["increasing"], summary
    assert summary["written"] > 0 and summary["moved"] == [13], summary
    shown = subprocess.run([sys.executable, str(example), "--config", str(path), "show", "--user", "13"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("user 13: shard 5 on db3, "), shown.stdout + shown.stderr
