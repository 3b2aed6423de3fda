"""The seqlock of next_id() checked with spin (docs/model/seqlock.pml): every interleaving of two readers, a
raiser and advance_generator hands out no value twice and increases per reader; and both the second read of the
offset and the generator lock are needed (without either, spin finds a counterexample). Skips without spin.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent.parent / "docs" / "model" / "seqlock.pml"

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None or shutil.which("gcc") is None, reason="needs spin and gcc (apt-get install spin gcc)"
)


def verify(tmp_path: Path, *defines: str) -> str:
    shutil.copy(MODEL, tmp_path / MODEL.name)
    subprocess.run(["spin", *defines, "-a", MODEL.name], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run(
        ["gcc", "-O2", "-DSAFETY", "-DCOLLAPSE", "-DMEMLIM=1024", "-o", "pan", "pan.c"], cwd=tmp_path, check=True, capture_output=True
    )
    return subprocess.run(["./pan"], cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout


def test_the_seqlock_never_hands_out_a_value_twice(tmp_path: Path) -> None:
    out = verify(tmp_path)
    assert "errors: 0" in out, out
    assert "MEMLIM" not in out and "max search depth too small" not in out, out  # the search was complete


@pytest.mark.parametrize("mutant", ["-DNO_SECOND_READ", "-DNO_LOCK"])
def test_without_the_check_or_the_lock_spin_finds_a_duplicate(tmp_path: Path, mutant: str) -> None:
    out = verify(tmp_path, mutant)
    assert "errors: 1" in out and "assertion violated" in out, out
