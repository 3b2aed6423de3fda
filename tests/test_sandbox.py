"""pgidgen sandbox up/down through the CLI: real servers, a config that works, nothing left behind."""
from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgidgen.cli import main
from pgidgen.config import load_config
from pgidgen.sandbox import load


def test_sandbox_up_and_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PGIDGEN_CONFIG", raising=False)
    runner = CliRunner()
    r = runner.invoke(main, ["sandbox", "up", "--databases", "1"])
    assert r.exit_code == 0, r.output
    try:
        cfg = load_config()
        assert list(cfg.databases) == ["db1"]
        with psycopg.connect(cfg.dsn("db1")) as conn:
            assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        again = runner.invoke(main, ["sandbox", "up", "--databases", "1", "--force"])
        assert again.exit_code == 1
        assert again.stderr.startswith("Error: a sandbox is already up in .pgidgen-sandbox: run 'pgidgen sandbox down' first")
        r = runner.invoke(main, ["sandbox", "up"])
        assert r.stderr == "Error: pgidgen.toml already exists: pass --force to overwrite it, or --write-config OTHER.toml\n"
    finally:
        root, _ = load(tmp_path / ".pgidgen-sandbox")
        r = runner.invoke(main, ["sandbox", "down"])
    assert r.exit_code == 0, r.output
    assert root is not None and not root.exists()
    assert not (tmp_path / "pgidgen.toml").exists()
    r = runner.invoke(main, ["sandbox", "down"])
    assert r.stderr.startswith("Error: no sandbox is up in .pgidgen-sandbox")
