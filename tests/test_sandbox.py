"""pgidgen sandbox up/down through the CLI: real servers, a config that works, nothing left behind."""
from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgidgen.cli import main
from pgidgen.config import load_config
from pgidgen.sandbox import down, load


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


def test_sandbox_bad_paths_start_nothing(tmp_path: Path) -> None:
    """An unwritable --write-config or a --dir that is a file is refused before any server starts; a state file
    pgidgen cannot read is an error, not a traceback (found by a review)."""
    runner = CliRunner()
    r = runner.invoke(main, ["sandbox", "up", "--databases", "1", "--dir", str(tmp_path / "sb"), "--write-config", str(tmp_path / "nodir" / "x.toml")])
    assert r.exit_code == 1 and r.output == f"Error: cannot write the config file {tmp_path / 'nodir' / 'x.toml'}: pass --write-config with a writable path in an existing directory\n"
    assert not (tmp_path / "sb").exists()
    (tmp_path / "afile").write_text("")
    r = runner.invoke(main, ["sandbox", "up", "--databases", "1", "--dir", str(tmp_path / "afile"), "--write-config", str(tmp_path / "y.toml")])
    assert r.exit_code == 1 and "is a file, not a directory" in r.output
    (tmp_path / "sb4").mkdir()
    (tmp_path / "sb4" / "sandbox.json").write_text("garbage")
    r = runner.invoke(main, ["sandbox", "down", "--dir", str(tmp_path / "sb4")])
    assert r.exit_code == 1 and "is not a sandbox state file pgidgen can read" in r.output and "Traceback" not in r.output


def test_sandbox_down_keeps_a_config_that_was_edited(tmp_path: Path) -> None:
    """down deletes the config up wrote only when it is still exactly that (an added database line was lost)."""
    runner = CliRunner()
    cfg = tmp_path / "pgidgen.toml"
    r = runner.invoke(main, ["sandbox", "up", "--databases", "1", "--dir", str(tmp_path / "sb"), "--write-config", str(cfg)])
    assert r.exit_code == 0, r.output
    cfg.write_text(cfg.read_text() + 'db9 = "postgresql://app@db9.example/app"\n')
    r = runner.invoke(main, ["sandbox", "down", "--dir", str(tmp_path / "sb")])
    assert r.exit_code == 0, r.output
    assert cfg.exists() and "db9" in cfg.read_text()


def test_a_pg_bindir_without_server_programs_is_refused_not_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PGIDGEN_PG_BINDIR names the one directory to use: one that does not exist, or holds only client programs,
    started the servers of whatever installation came next (another major) without a word (found by a review)."""
    monkeypatch.delenv("PGIDGEN_PG_VERSION", raising=False)
    clients_only = tmp_path / "bin"
    clients_only.mkdir()
    for program in ("pg_dump", "pg_restore", "psql"):
        (clients_only / program).write_text('#!/bin/sh\necho "psql (PostgreSQL) 15.4 (Debian 15.4-1.pgdg120+1)"\n')
        (clients_only / program).chmod(0o755)
    for bindir in (tmp_path / "missing", clients_only):
        monkeypatch.setenv("PGIDGEN_PG_BINDIR", str(bindir))
        try:
            r = CliRunner().invoke(main, ["sandbox", "up", "--databases", "1", "--dir", str(tmp_path / "sb"), "--write-config", str(tmp_path / "x.toml")])
        finally:
            if (tmp_path / "sb" / "sandbox.json").exists():  # started after all: stop it
                down(tmp_path / "sb")
        assert r.exit_code == 1, r.output
        assert r.output == (f"Error: PGIDGEN_PG_BINDIR={bindir} holds no runnable initdb, pg_ctl and postgres:"
                            " point it at a PostgreSQL bin directory that has them, or unset it\n")
        assert not (tmp_path / "sb" / "sandbox.json").exists() and not (tmp_path / "x.toml").exists()


def test_make_clean_stops_a_sandbox_that_is_up(tmp_path: Path) -> None:
    """README's steps leave `pgidgen sandbox up`'s servers running with their state in .pgidgen-sandbox; `make
    clean` deleted that directory (and the venv) without stopping them: servers nobody could find any more, their
    ports taken, until a reboot (found by a review)."""
    import shutil
    import subprocess
    import sys

    from pgidgen import sandbox

    repo = Path(__file__).resolve().parent.parent
    work = tmp_path / "checkout"
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(repo / "Makefile", work)
    (work / ".venv" / "bin" / "pgidgen").symlink_to(Path(sys.executable).parent / "pgidgen")
    r = CliRunner().invoke(main, ["sandbox", "up", "--databases", "1", "--dir", str(work / ".pgidgen-sandbox"),
                                  "--write-config", str(work / "pgidgen.toml")])
    assert r.exit_code == 0, r.output
    root, servers = load(work / ".pgidgen-sandbox")
    try:
        done = subprocess.run(["make", "-s", "clean"], cwd=work, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not (work / ".pgidgen-sandbox").exists() and not (work / ".venv").exists()
        assert root is not None and not root.exists()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(servers[0].dsn, connect_timeout=5).close()
    finally:
        sandbox.destroy(servers, root)


def test_a_server_that_started_but_could_not_be_set_up_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """create_server started the server, then failed to create its database (here: PGOPTIONS making sessions
    read-only; or a Ctrl-C): `sandbox up` deleted its data directory under it and left it running, holding its
    port, with nothing left to stop it by (found by a review)."""
    import shutil

    from pgidgen import pgbin, sandbox
    from pgidgen.errors import SandboxError

    root = sandbox.make_root()
    port = sandbox.free_port()
    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_read_only=on")
    try:
        with pytest.raises(SandboxError, match="cannot create the app database on db1: cannot execute CREATE DATABASE in a read-only transaction"):
            sandbox.create_server(root, "db1", port=port)
        assert not (root / "db1" / "postmaster.pid").exists(), "the server is still running"
    finally:
        inst = pgbin.server()
        sandbox.destroy([sandbox.Server("db1", port, str(root / "db1"), bindir=str(inst.bindir))], None)
        shutil.rmtree(root, ignore_errors=True)


def test_destroy_stops_a_server_whose_pg_ctl_is_gone() -> None:
    """A sandbox whose installation was removed meanwhile (its pg_ctl gone) was left running when destroyed:
    pg_ctl's failure was ignored and the data directory deleted under the postmaster (found by a review). It is
    stopped by the pid its data directory records."""
    import dataclasses
    import os

    from pgidgen import sandbox

    root = sandbox.make_root()
    server = sandbox.create_server(root, "db1")
    pid = int((Path(server.datadir) / "postmaster.pid").read_text().split()[0])
    try:
        sandbox.destroy([dataclasses.replace(server, bindir=str(root / "no-such-bin"))], root)
        with pytest.raises(ProcessLookupError):  # gone by the time destroy returns
            os.kill(pid, 0)
        assert not root.exists()
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
