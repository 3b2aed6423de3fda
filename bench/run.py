"""make bench: runs every bench/bench_*.py (or the ones named on the command line) and prints their ratios.

Each bench module has `run() -> None` that starts its own throwaway servers (bench/common.py) and prints
measurements next to the baselines it measured in the same run. These machines are shared and noisy:
read the ratios, not the absolute times.
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem for p in HERE.glob("bench_*.py"))
    failed = 0
    for name in names:
        mod = importlib.import_module(name if name.startswith("bench_") else f"bench_{name}")
        print(f"\n# {mod.__name__}: {(mod.__doc__ or '').strip().splitlines()[0] if mod.__doc__ else ''}", flush=True)
        t0 = time.perf_counter()
        try:
            mod.run()
        except Exception as e:  # a bench that breaks is reported, the others still run
            failed += 1
            print(f"  FAILED: {type(e).__name__}: {e}", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f}s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
