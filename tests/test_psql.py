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
