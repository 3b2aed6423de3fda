"""`pgidgen check` against a hot standby: a connection string that reaches a read-only replica (a reader
endpoint, a failed-over primary's old address) must fail the check, not pass it and leave init or the move
to fail later."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgidgen import pgbin, sandbox
from pgidgen.cli import main
from pgidgen.config import write_config
from pgidgen.layout import Layout


@pytest.fixture(scope="module")
def standby() -> Iterator[sandbox.Server]:
    """A primary and its streaming standby (pg_basebackup -R), both throwaway."""
    root = sandbox.make_root()
    primary = sandbox.create_server(root, "primary")
    replica = sandbox.Server(name="standby", port=sandbox.free_port(), datadir=str(root / "standby"),
                             bindir=primary.bindir, version=primary.version)
    # the server's own pg_basebackup, else the client tools' (a newer one backs up an older server): the npm
    # registry's builds of 15-17 have no client programs
    basebackup = Path(primary.bindir) / "pg_basebackup"
    if not basebackup.is_file():
        basebackup = pgbin.clients().bindir / "pg_basebackup"
    try:
        sandbox._run([str(basebackup), "-D", replica.datadir, "-R", "-X", "stream",
                      "-c", "fast", "-d", f"host=127.0.0.1 port={primary.port} user={sandbox.SUPERUSER}"], what="pg_basebackup the standby")
        settings = Path(replica.datadir) / "postgresql.auto.conf"
        settings.write_text(settings.read_text() + f"port = {replica.port}\nunix_socket_directories = '{replica.datadir}'\n")
        sandbox.start(replica)
        yield replica
    finally:
        sandbox.destroy([replica, primary], root)


def test_check_fails_a_standby(standby: sandbox.Server, fresh_dsns: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "pgidgen.toml"
    write_config(path, Layout.make(), {"db1": fresh_dsns["db1"], "replica": standby.dsn})
    r = CliRunner().invoke(main, ["--config", str(path), "check", "--no-reach"])
    assert r.exit_code == 1, r.output
    assert ("replica: FAIL primary: the server is a standby (in recovery), read-only: init, apply-ddl and moves"
            " write to every database: point the config at the primary\n") in r.output, r.output
    assert "db1: ok primary: not a standby\n" in r.output
    failed = {(f["database"], f["item"]) for f in json.loads(CliRunner().invoke(main, ["--config", str(path), "check", "--json"]).output)["findings"] if not f["ok"]}
    assert ("replica", "primary") in failed and not any(name == "db1" for name, _ in failed), failed
    # move-shard makes the same check before it journals anything
    cli = lambda *a: CliRunner().invoke(main, ["--config", str(path), *a])  # noqa: E731
    assert cli("init", "--shards", "2", "--databases", "db1").exit_code == 0
    r = cli("move-shard", "0", "replica")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "is a standby" in r.output, r.output
