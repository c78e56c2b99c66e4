"""CPU cost of the online tests' spool high-water sampler (``tests/integration/test_online.py`` ``HighWater``):
one pass over a spool-like folder (``--files`` samples in ``kept/`` and a few in flight beside it), the old
scan (``Path.rglob`` + ``stat``) against the new one (``os.scandir``, recursive), alternating rounds. Both must
find the same byte total. The sampler runs a pass every 5 ms beside the trainer and its capture server, on
the same two cores, for the whole of the online tests (~5 min of lane time).

    .venv/bin/python benchmarks/spool_scan.py [--files 40] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]
from test_online import tree_bytes as scandir_bytes  # noqa: E402 -- the new scan, as the suite runs it


def rglob_bytes(folder: Path) -> int:
    """The old scan."""
    total = 0
    for f in folder.rglob("*") if folder.exists() else ():
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:
            pass
    return total


def cpu_per_second(scan, folder: Path, seconds: float) -> tuple[float, int]:
    """CPU seconds a wall second of the sampler's loop (a pass, then 5 ms of sleep) takes; passes made."""
    c0, t0, n = time.process_time(), time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        scan(folder)
        n += 1
        time.sleep(0.005)
    return (time.process_time() - c0) / (time.monotonic() - t0), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        spool = Path(d) / "spool"
        (spool / "rank0" / "kept").mkdir(parents=True)
        for i in range(a.files):
            (spool / "rank0" / "kept" / f"s{i}.safetensors").write_bytes(os.urandom(50_000))
        for i in range(5):
            (spool / "rank0" / f"f{i}.safetensors").write_bytes(os.urandom(1000))
        assert rglob_bytes(spool) == scandir_bytes(spool) == a.files * 50_000 + 5 * 1000
        old, new = [], []
        for r in range(1, a.rounds + 1):
            (o, no), (s, ns) = cpu_per_second(rglob_bytes, spool, a.seconds), cpu_per_second(scandir_bytes, spool, a.seconds)
            old.append(o)
            new.append(s)
            print(f"round {r}: rglob {o:.4f} CPU s / s ({no} passes), scandir {s:.4f} CPU s / s ({ns} passes); "
                  f"{o / s:.2f}x")
    old.sort()
    new.sort()
    print(f"{a.files} kept samples + 5 in flight: median rglob {old[len(old) // 2]:.4f}, scandir "
          f"{new[len(new) // 2]:.4f} CPU s a wall second of sampling")


if __name__ == "__main__":
    main()
