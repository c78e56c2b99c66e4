"""How long the trainer's loader threads hold the GIL: the training step's thread kept waiting while
``train.loader_threads`` threads read and verify samples, before and after ``read_sample`` took its
buffer from ``torch.empty`` instead of ``bytearray`` (which zeroes the sample with the GIL held).

On the H200 the loop's loader cost the trainer 9 % of its tokens/s against batches already in memory
(``benchmarks/results/h200-2026-12-06-s20/``); the trainer's thread needs the GIL between its CUDA calls.
Here the step's thread is a ticker: it sleeps 0.5 ms (the GIL released, as while a CUDA graph runs) and
counts how late it wakes, while the loader threads read every sample of Llama-3.1-8B-shaped shards
(hidden 4096, 3 aux layers, bf16, 2,048 tokens: 64 MiB a sample) through ``ShardReader.get``. Side by side
in one run, alternating per round: ``before`` (``read_sample`` from git ``BEFORE``) and ``after`` (today's).
Prints each round's stall (ms the ticker woke late, per sample read) and read rate, and the ratios.

    python benchmarks/loader_gil.py [--samples 16] [--rounds 3] [--threads 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "8fa4b1e"  # the last read_sample with a bytearray buffer


def format_at(commit: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:src/eaglebox/shards/format.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.gettempdir()) / f"eaglebox_format_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"format_{commit}", path)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one_round(reader, threads: int) -> dict:
    from eaglebox.train.data import prefetch

    late, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.0005)
            late.append(time.perf_counter() - t - 0.0005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.perf_counter()
    nbytes = 0
    for _, s in prefetch(reader.get, range(len(reader)), threads):
        nbytes += sum(s[k].numel() * s[k].element_size() for k in ("aux", "last"))
    dt = time.perf_counter() - t0
    stop.set()
    ticker.join()
    return {"stall_ms_per_sample": 1000 * sum(late) / len(reader), "gb_per_s": nbytes / dt / 1e9,
            "worst_wake_ms": 1000 * max(late)}


def main() -> None:
    from verified_reads import write_shards

    from eaglebox.shards import format as after

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    before = format_at(BEFORE)
    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(tmp) / "shards"
        write_shards(shards, a.samples)
        readers = {"before": before.ShardReader(shards), "after": after.ShardReader(shards)}
        for r in readers.values():  # warm-up: the page cache, the allocator
            one_round(r, a.threads)
        rows = []
        for rnd in range(1, a.rounds + 1):
            row = {name: one_round(r, a.threads) for name, r in readers.items()}
            rows.append(row)
            print(f"round {rnd}: " + "; ".join(
                f"{n} stall {v['stall_ms_per_sample']:.1f} ms/sample, worst wake {v['worst_wake_ms']:.1f} ms, "
                f"{v['gb_per_s']:.2f} GB/s" for n, v in row.items()), flush=True)
    stall = [r["before"]["stall_ms_per_sample"] / max(r["after"]["stall_ms_per_sample"], 1e-9) for r in rows]
    rate = [r["after"]["gb_per_s"] / r["before"]["gb_per_s"] for r in rows]
    print(f"{a.samples} samples of 64 MiB, {a.threads} loader threads, {a.rounds} rounds")
    print(f"stall before/after: median {statistics.median(stall):.1f}x, worst round {min(stall):.1f}x")
    print(f"read rate after/before: median {statistics.median(rate):.2f}x, worst round {min(rate):.2f}x")


if __name__ == "__main__":
    main()
