"""Seconds to import SGLang's scheduler (what every server process and most CLI runs import) with the
venv's compiled bytecode and without it, alternating, side by side in one run.

Without: PYTHONPYCACHEPREFIX points at an empty folder and PYTHONDONTWRITEBYTECODE=1, so every import
compiles from source as it did before `make venv` compiled the venv (uv writes no .pyc by default and CI
sets PYTHONDONTWRITEBYTECODE).

    .venv/bin/python benchmarks/import_time.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

MODULE = "sglang.srt.managers.scheduler"


def seconds(env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {MODULE}"], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    base = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    ratios = []
    with tempfile.TemporaryDirectory() as empty:
        for r in range(rounds):
            cold = seconds({**base, "PYTHONPYCACHEPREFIX": empty})
            warm = seconds(base)
            ratios.append(cold / warm)
            print(f"round {r + 1}: from source {cold:.1f} s, compiled {warm:.1f} s, ratio {cold / warm:.2f}x",
                  flush=True)
    print(f"import {MODULE}: compiled bytecode {sorted(ratios)[len(ratios) // 2]:.2f}x faster (median of "
          f"{rounds}), worst round {min(ratios):.2f}x; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
