"""The wheel carries templates/ and sql/: install it into a fresh venv and run pgidgen from elsewhere."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_works_from_any_directory(tmp_path: Path, fresh_dsns: dict[str, str]) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], check=True, capture_output=True)
    wheel = next(dist.glob("pgidgen-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # pgidgen's dependencies come from the environment running the tests (not from the network), as plain
    # directories on sys.path: a .pth file's entries are not site dirs, so the source tree's editable install
    # that lives there stays out, and the only pgidgen the new venv sees is the wheel's.
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "pgidgen_test_deps.pth").write_text("\n".join(sorted(set(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))) + "\n")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pgidgen.toml").write_text(f'[databases]\ndb1 = "{fresh_dsns["db1"]}"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGIDGEN_CONFIG")}
    run = lambda *a: subprocess.run([str(venv / "bin" / "pgidgen"), *a], cwd=elsewhere, env=env, capture_output=True, text=True)  # noqa: E731
    r = run("init", "--shards", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("db1: catalog installed, created 3 shards (0-2)")
    out = run("-h")
    assert "sandbox" in out.stdout
    # the installed package reads its own copy of templates/, not the source tree
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from pgidgen.render import data_dir; print(data_dir('templates'))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )
    assert str(venv) in probe.stdout and "_data" in probe.stdout
    # the ORM integrations ship in the package, and import from it
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pgidgen.integrations.django as d, pgidgen.integrations.sqlalchemy as s; print(d.__file__, s.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.count(str(venv)) == 2


def test_the_declared_psycopg_floor_has_the_apis_pgidgen_calls() -> None:
    """pgidgen calls psycopg 3.2's Connection.notifies(timeout=...) (a Router's listeners), Composable.as_string()
    without a context (check's hints) and Connection.cancel_safe() (moves): under psycopg 3.1, which the
    dependency allowed, `pgidgen check` died with a TypeError traceback and every listener thread with another
    (found by a review)."""
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"psycopg(\[|>|=|$)", d)]
    floor = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert floor is not None, spec
    assert (int(floor.group(1)), int(floor.group(2))) >= (3, 2), spec
