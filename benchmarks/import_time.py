"""Seconds to import SGLang's scheduler (what every server process and most CLI runs import) with the
venv's compiled bytecode and without it, alternating, side by side in one run: wall time, and the child's
CPU time (user + system), which other work on the machine does not inflate.

Without: PYTHONPYCACHEPREFIX points at an empty folder and PYTHONDONTWRITEBYTECODE=1, so every import
compiles from source as it did before `make venv` compiled the venv (uv writes no .pyc by default and CI
sets PYTHONDONTWRITEBYTECODE).

    .venv/bin/python benchmarks/import_time.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

MODULE = "sglang.srt.managers.scheduler"


def seconds(env: dict) -> tuple[float, float]:
    """(wall, CPU) seconds of one interpreter importing :data:`MODULE`."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {MODULE}"], env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    base = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    with tempfile.TemporaryDirectory() as empty:
        for r in range(rounds):
            cold = seconds({**base, "PYTHONPYCACHEPREFIX": empty})
            warm = seconds(base)
            for i, kind in enumerate(ratios):
                ratios[kind].append(cold[i] / warm[i])
            print(f"round {r + 1}: from source {cold[0]:.1f} s wall / {cold[1]:.1f} s CPU, compiled {warm[0]:.1f} s "
                  f"wall / {warm[1]:.1f} s CPU; ratio {cold[0] / warm[0]:.2f}x wall, {cold[1] / warm[1]:.2f}x CPU",
                  flush=True)
    for kind, rs in ratios.items():
        print(f"import {MODULE}, {kind} time: compiled bytecode {sorted(rs)[len(rs) // 2]:.2f}x faster (median of "
              f"{rounds}), worst round {min(rs):.2f}x")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
