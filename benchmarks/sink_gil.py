"""The capture sink under a busy scheduler, without a GPU: writer threads vs the writer process.

Inside SGLang the scheduler thread runs Python without pause while it drives a GPU; writer threads in
its interpreter wait for the GIL at every return from C, and wrote at a third of the disk's rate on the
H200 (issue 29). This reproduces that on a CPU: one thread plays the scheduler, doing ``--work-ms`` of
Python before each prefill chunk (4.5 ms: a 512-token chunk at the H200's 112k tokens/s) and handing
the chunk to the sink as ``capture/hook.py`` does, for N samples of 500-3,000 rows (3 aux layers + last).
The Python is ``bytecode`` (the interpreter's loop: the GIL changes hands every switch interval) or
``pickle`` (also ~1 ms C calls that keep the GIL, as SGLang's scheduler pickles its outputs). Side by
side in one run, for each width and dtype, alternating per round:

- ``threads``: the sink as it was, writer threads in the scheduler's interpreter (its source read from
  git, ``--threads-sink``);
- ``process``: today's sink, its writer process fed through shared memory;
- ``disk``: a raw sequential write of the same bytes to the same folder (64 MiB blocks, fsync).

Each sink rate is from the first chunk to ``flush()`` (every file fsync'd and renamed). Prints each
round's rates (GB/s), each sink's rate / the disk's in that round, the process / threads ratio per round
and the worst round, the seconds the scheduler's loop took to hand over every chunk (``sched_s``) and
spent inside ``add_chunk`` (``add_s``: the process sink's copy into shared memory). An untimed warm-up
round comes first (printed, not summarised): the shared memory's pages are faulted in once per server.

    python benchmarks/sink_gil.py --out-dir /tmp/sink-gil [--samples 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch

from eaglebox.extract.throughput import disk_write_rate

ROOT = Path(__file__).resolve().parents[1]
THREADS_COMMIT = "0229102"  # the last sink with writer threads
CHUNK = 512  # SGLang's chunked prefill size in the H200 runs of issue 29


def threads_sink_module(commit: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:src/eaglebox/capture/sink.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(f"/tmp/eaglebox_sink_threads_{commit}.py")
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"sink_threads_{commit}", path)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BATCH = [{"rid": i, "output_ids": list(range(8)), "finished": False} for i in range(2000)]


def scheduler_work(kind: str, seconds: float) -> None:
    """A scheduler's Python between two chunks. ``bytecode``: the interpreter's loop only (it gives the
    GIL up every switch interval when asked). ``pickle``: also ~1 ms C calls that keep the GIL, as
    SGLang's scheduler pickles its outputs (``send_pyobj``) or turns tensors into lists (``tolist``)."""
    d = {}
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        if kind == "pickle":
            pickle.dumps(BATCH)
        for j in range(200):
            d[j] = i
        i += 1


def plan(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(500, 3000) for _ in range(n)]


def feed(sink, lengths: list[int], aux_pool: torch.Tensor, last_pool: torch.Tensor, seed: int, kind: str,
         work_s: float) -> tuple[float, float, int]:
    """The scheduler thread: ``work_s`` of Python, then one chunk to the sink, chunk after chunk; then
    ``flush``. Returns the seconds to the last ``add_chunk``'s return, to the flush, and the bytes."""
    rng = random.Random(seed)
    total = 0
    t0 = time.perf_counter()
    for rows in lengths:
        sid = uuid.uuid4().hex
        ids = [rng.randrange(32000) for _ in range(rows)]
        for a in range(0, rows, CHUNK):
            n = min(CHUNK, rows - a)
            o = rng.randrange(aux_pool.shape[0] - CHUNK)
            # fresh host tensors per chunk, as SGLang's copy_to_cpu hands them over
            aux, last = aux_pool[o : o + n].clone(), last_pool[o : o + n].clone()
            scheduler_work(kind, work_s)
            sink.add_chunk(f"eaglebox-{sid}-0", sid, ids, aux, last)
            total += (aux.numel() + last.numel()) * aux.element_size()
    t1 = time.perf_counter()
    sink.flush()
    return t1 - t0, time.perf_counter() - t0, total


def clear(folder: Path) -> None:
    for f in folder.iterdir():
        f.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True, help="a folder on the disk to measure")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, nargs="+", default=[4096, 7168])
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--work", nargs="+", default=["bytecode", "pickle"], help="the scheduler's Python (scheduler_work)")
    ap.add_argument("--work-ms", type=float, default=4.5,
                    help="the scheduler's Python per chunk: 512 tokens at the H200's 112k tokens/s prefill")
    ap.add_argument("--threads-sink", default=THREADS_COMMIT, help="git commit of the threads sink")
    a = ap.parse_args()
    from eaglebox.capture import sink as process_mod

    threads_mod = threads_sink_module(a.threads_sink)
    sys.setswitchinterval(0.0005)  # as capture/hook.py sets it in the scheduler (EAGLEBOX_CAPTURE_SWITCH_INTERVAL_S)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, switch interval "
          f"{sys.getswitchinterval() * 1e3:.1f} ms, {a.samples} samples of 500-3000 rows a round, chunks of "
          f"{CHUNK}, 3 aux layers + last, {a.writers} writers, out dir {a.out_dir}", flush=True)
    summary = []
    configs = [(work, hidden, dtype_name) for work in a.work for hidden in a.hidden for dtype_name in a.dtype]
    for work, hidden, dtype_name in configs:
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(0)
        aux_pool = torch.randn(3000 + CHUNK, 3 * hidden, generator=g).to(dtype)
        last_pool = torch.randn(3000 + CHUNK, hidden, generator=g).to(dtype)
        folders = {m: a.out_dir / f"{m}-{hidden}-{dtype_name}" for m in ("threads", "process")}
        for f in folders.values():
            shutil.rmtree(f, ignore_errors=True)
            f.mkdir(parents=True)
        sinks = {"threads": threads_mod.CaptureSink(folders["threads"], writers=a.writers),
                 "process": process_mod.CaptureSink(folders["process"], writers=a.writers)}
        for name, sink in sinks.items():  # the writer process is up, its imports done
            sink.add_chunk("warm", "warm", [1], aux_pool[:1].clone(), last_pool[:1].clone())
            sink.flush()
            clear(folders[name])
        rounds = []
        for r in range(-1, a.rounds):  # round -1 warms up (page cache, the shared memory's first touch)
            lengths = plan(a.samples, seed=r)
            row = {}
            order = ("threads", "process") if r % 2 == 0 else ("process", "threads")
            for mode in order:
                add_s = sinks[mode].stats["add_s"]
                sched_s, secs, nbytes = feed(sinks[mode], lengths, aux_pool, last_pool, r, work, a.work_ms / 1e3)
                row[mode] = nbytes / secs
                row[f"{mode}_sched_s"] = sched_s
                row[f"{mode}_add_s"] = sinks[mode].stats["add_s"] - add_s
                clear(folders[mode])
            row["disk"] = disk_write_rate(a.out_dir, nbytes)
            if r >= 0:
                rounds.append(row)
            print(json.dumps({"work": work, "hidden": hidden, "dtype": dtype_name, "round": r if r >= 0 else "warm-up",
                              "GB": round(nbytes / 1e9, 2),
                              **{k: round(v / 1e9, 3) if "_" not in k else round(v, 2) for k, v in row.items()},
                              "threads/disk": round(row["threads"] / row["disk"], 2),
                              "process/disk": round(row["process"] / row["disk"], 2),
                              "process/threads": round(row["process"] / row["threads"], 2)}), flush=True)
        sinks["process"].close()
        summary.append((work, hidden, dtype_name, rounds))
    print("\nmedian GB/s; ratios per round | worst; sched = seconds the scheduler's loop took (threads/process), "
          f"{a.work_ms} ms of its own Python per chunk")
    print(f"{'work':8s} {'hidden':>6s} {'dtype':9s} {'disk':>6s} {'threads':>8s} {'process':>8s} {'threads/disk':>22s} "
          f"{'process/disk':>22s} {'process/threads':>22s} {'sched thr/proc':>14s}")
    for work, hidden, dtype_name, rounds in summary:
        def ratios(key_a, key_b, rounds=rounds):
            v = [r[key_a] / r[key_b] for r in rounds]
            return " ".join(f"{x:.2f}" for x in v) + f" | {min(v):.2f}"
        med = {k: sorted(r[k] for r in rounds)[len(rounds) // 2] for k in rounds[0]}
        print(f"{work:8s} {hidden:6d} {dtype_name:9s} {med['disk'] / 1e9:6.2f} {med['threads'] / 1e9:8.2f} "
              f"{med['process'] / 1e9:8.2f} {ratios('threads', 'disk'):>22s} {ratios('process', 'disk'):>22s} "
              f"{ratios('process', 'threads'):>22s} {med['threads_sched_s']:6.2f}/{med['process_sched_s']:.2f}")


if __name__ == "__main__":
    main()
