"""GPU harness for the capture sink: correctness under stream reuse, and throughput against the disk.

Drives :class:`eaglebox.capture.sink.CaptureSink` the way the hook does inside SGLang 0.5.23, with
CUDA tensors produced on a side stream (the overlap scheduler's forward stream) that the producer
overwrites -- the next CUDA-graph replay into the same static buffers -- and frees and reallocates
right after ``add_chunk`` returns, without waiting for anything. Every sample's file is compared
byte for byte with a copy of what was produced. Three hand-overs, as the hook may see them:

- ``device``: aux and last rows are device views of the static buffers (no overlap, or a path where
  SGLang's ``copy_to_cpu`` did not run);
- ``aux-on-host``: aux moved to pinned host memory by SGLang's ``copy_to_cpu`` (its ``async_d2h`` on a
  copy stream behind the forward, synchronised by ``copy_done``), last still a device view: stock
  SGLang 0.5.23 under overlap scheduling;
- ``both-on-host``: both moved by ``copy_to_cpu``: what eaglebox's ``copy_to_cpu`` wrapper hands over.

``--old-sink FILE`` also drives another sink module (e.g. ``git show c20cc56:src/eaglebox/capture/sink.py``)
side by side, to show what it did with the same hand-overs.

Throughput: the sink's bytes/s (first chunk to files on disk, ``os.sync`` included) against a raw
sequential write of the same bytes to the same disk (64 MiB blocks, fsync), alternating, per round.

    python benchmarks/capture_gpu.py --out-dir /tmp/cap --old-sink old_sink.py
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

import torch
from safetensors import safe_open

WIDTHS = {"kimi-k2.5": 7168, "llama-3.1-8b": 4096}
MODES = ("device", "aux-on-host", "both-on-host")


def load_sink_module(path: str | None):
    if path is None:
        from eaglebox.capture import sink
        return sink
    spec = importlib.util.spec_from_file_location(f"sink_{uuid.uuid4().hex[:6]}", path)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


def make_sink(mod, out_dir: Path, writers: int | None):
    params = inspect.signature(mod.CaptureSink).parameters
    kw = {"buffer_bytes": 8 << 30} if "buffer_bytes" in params else {"queue_size": 8}
    if writers is not None:
        kw["writers"] = writers
    sink = mod.CaptureSink(out_dir, header={"engine": "harness"}, **kw)
    takes_rid = "rid" in inspect.signature(sink.add_chunk).parameters

    def add(rid, sid, ids, aux, last):
        return sink.add_chunk(rid, sid, ids, aux, last) if takes_rid else sink.add_chunk(sid, ids, aux, last)
    return sink, add


def async_d2h(t: torch.Tensor) -> torch.Tensor:
    """SGLang 0.5.23's ``sglang.srt.utils.common.async_d2h``, as ``copy_to_cpu`` uses it."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    t.record_stream(torch.cuda.current_stream())
    return host


def run_sink(mod, mode: str, hidden: int, samples: int, rows: int, chunk: int, out_dir: Path, seed: int,
             keep_refs: bool = True, writers: int | None = None):
    """Produce ``samples`` prompts of ``rows`` rows in ``chunk``-row prefill chunks; returns the
    reference bytes per sample (when ``keep_refs``: a copy that costs time), the sink's elapsed seconds
    and its bytes."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    sink, add = make_sink(mod, out_dir, writers)
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    static_aux = torch.empty(chunk, 3 * hidden, dtype=torch.bfloat16, device="cuda")  # CUDA-graph outputs
    static_last = torch.empty(chunk, hidden, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    refs: dict[str, dict[str, list[torch.Tensor]]] = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(samples):
        sid, ids = f"s{s:04d}", list(range(s, s + rows))
        rid = f"eaglebox-{sid}-{uuid.uuid4().hex[:8]}"
        refs[sid] = {"aux": [], "last": []}
        for a in range(0, rows, chunk):
            n = min(chunk, rows - a)
            with torch.cuda.stream(forward):  # the forward of this chunk writes the static buffers
                static_aux[:n].normal_(generator=gen)
                static_last[:n].normal_(generator=gen)
                scratch = torch.empty(n, 4 * hidden, dtype=torch.bfloat16, device="cuda")  # freed below
                done = torch.cuda.Event()
                done.record()
            aux, last = static_aux[:n], static_last[:n]
            if mode != "device":
                with torch.cuda.stream(copy):  # SGLang's copy_to_cpu, queued right behind the forward
                    copy.wait_stream(forward)
                    aux = async_d2h(aux)
                    if mode == "both-on-host":
                        last = async_d2h(last)
                    done = torch.cuda.Event()
                    done.record()
            done.synchronize()  # SGLang's copy_done.synchronize() before processing results
            if keep_refs:  # the reference: what was produced
                refs[sid]["aux"].append(static_aux[:n].cpu())
                refs[sid]["last"].append(static_last[:n].cpu())
            add(rid, sid, ids, aux, last)
            with torch.cuda.stream(forward):  # the next replay rewrites the buffers, and memory is reused
                del scratch
                static_aux.fill_(float("nan"))
                static_last.fill_(float("nan"))
                torch.empty(n, 4 * hidden, dtype=torch.bfloat16, device="cuda").fill_(7.0)
    sink.flush()
    os.sync()
    elapsed = time.perf_counter() - t0
    nbytes = samples * rows * 4 * hidden * 2
    return refs, elapsed, nbytes


def count_corrupt(out_dir: Path, refs) -> tuple[int, list[str]]:
    bad = []
    for sid, want in refs.items():
        with safe_open(str(out_dir / f"{sid}.safetensors"), "pt") as f:
            for key in ("aux", "last"):
                got, ref = f.get_tensor(key), torch.cat(want[key])
                if not torch.equal(got.view(torch.int16), ref.view(torch.int16)):
                    bad.append(f"{sid}:{key}")
    return len({b.split(":")[0] for b in bad}), bad


def raw_write(path: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` sequentially (64 MiB blocks, one fsync), the disk's rate."""
    block = os.urandom(64 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/eaglebox-capture-gpu"))
    ap.add_argument("--old-sink", help="another sink module to drive side by side (e.g. before a fix)")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writers", type=int, nargs="+", default=[2, 4], help="writer threads to time")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sinks = {"current": load_sink_module(None)}
    if a.old_sink:
        sinks["old"] = load_sink_module(a.old_sink)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; {a.samples} samples x {a.rows} rows, "
          f"prefill chunks of {a.chunk}, bf16", flush=True)
    result = {"correctness": [], "throughput": []}
    print("\n## correctness: samples whose file differs from what was produced (byte for byte)")
    for width, hidden in WIDTHS.items():
        for mode in MODES:
            for name, mod in sinks.items():
                refs, _, _ = run_sink(mod, mode, hidden, a.samples, a.rows, a.chunk, a.out_dir, seed=1)
                n_bad, bad = count_corrupt(a.out_dir, refs)
                result["correctness"].append({"sink": name, "width": width, "mode": mode, "corrupt": n_bad,
                                              "samples": a.samples, "tensors": bad[:8]})
                print(f"{name:8s} {width:13s} {mode:13s} corrupt {n_bad:2d}/{a.samples}"
                      + (f"  e.g. {', '.join(bad[:4])}" if bad else ""), flush=True)
    print("\n## throughput (current sink, both-on-host, kimi width, no reference copies): sink vs raw "
          "sequential fsync'd write of the same bytes, alternating")
    for r in range(a.rounds):
        for writers in a.writers:
            _, sink_s, nbytes = run_sink(sinks["current"], "both-on-host", WIDTHS["kimi-k2.5"], a.samples, a.rows,
                                         a.chunk, a.out_dir, seed=2, keep_refs=False, writers=writers)
            raw_s = raw_write(a.out_dir / "raw.bin", nbytes)
            row = {"round": r, "writers": writers, "bytes": nbytes, "sink_s": sink_s, "raw_s": raw_s,
                   "sink_gbps": nbytes / sink_s / 1e9, "raw_gbps": nbytes / raw_s / 1e9,
                   "tokens_per_s": a.samples * a.rows / sink_s, "ratio": raw_s / sink_s}
            result["throughput"].append(row)
            print(f"round {r} writers {writers}: sink {row['sink_gbps']:.2f} GB/s ({row['tokens_per_s']:,.0f} tok/s), "
                  f"raw {row['raw_gbps']:.2f} GB/s, sink/raw {row['ratio']:.2f}x", flush=True)
    for writers in a.writers:
        ratios = [row["ratio"] for row in result["throughput"] if row["writers"] == writers]
        print(f"writers {writers}: sink/raw median {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x "
              f"over {a.rounds} rounds")
    shutil.rmtree(a.out_dir, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    if any(c["corrupt"] for c in result["correctness"] if c["sink"] == "current"):
        sys.exit(1)


if __name__ == "__main__":
    main()
