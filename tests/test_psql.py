"""`pgidgen psql DB`: psql (the one pgidgen finds) on a database of the config."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PGIDGEN = [sys.executable, "-m", "pgidgen"]


def test_psql_runs_on_a_database_of_the_config(config_file: Path) -> None:
    r = subprocess.run([*PGIDGEN, "--config", str(config_file), "psql", "db2", "-A", "-t", "-c", "SELECT current_database() <> 'postgres', 40 + 2"],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "t|42"), r.stderr


def test_psql_names_the_databases_it_knows(config_file: Path) -> None:
    r = subprocess.run([*PGIDGEN, "--config", str(config_file), "psql", "db9"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == "Error: no database 'db9' in the config: use one of db1, db2, db3\n", r.stderr


def test_a_connection_string_libpq_misreads_shows_no_part_of_its_password(tmp_path: Path) -> None:
    """psql was run with what libpq misread of the string (user:password@ read as a host, a port): pieces of the
    password went on psql's command line (which `ps` shows) and into its errors, which pgidgen does not scrub."""
    import os

    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "${DB1}"\n')
    for dsn in ("postgresql://u:top@SECRETpart@127.0.0.1:1/app", "postgresql://u:SECRET#pass/word99@127.0.0.1:1/app",
                "postgresql://u:12,SECREThost/x@127.0.0.1:1/db", "host=127.0.0.1 port=1 password=ab cd/SECRET'x"):
        r = subprocess.run([*PGIDGEN, "--config", str(path), "psql", "db1", "-c", "SELECT 1"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "DB1": dsn})
        assert r.returncode == 1 and "SECRET" not in r.stdout + r.stderr, r.stderr
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and "--traceback" not in r.stderr, r.stderr


def test_psql_with_no_databases_configured_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "pgidgen.toml"
    path.write_text("[layout]\n")
    r = subprocess.run([*PGIDGEN, "--config", str(path), "psql", "db1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == (f"Error: no databases are configured ({path}): add a [databases] section, or run"
                                              " 'pgidgen sandbox up' for local throwaway servers\n"), r.stderr
