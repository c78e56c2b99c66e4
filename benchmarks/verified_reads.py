"""What verification costs: the trainer reading and hashing every sample vs reading nothing, and the
weight fingerprint over every byte (issue 28).

1. Shards shaped like Llama-3.1-8B's capture (hidden 4096, 3 aux layers, bf16, 2048-token samples:
   64 MiB a sample), written by the capture sink's own writer, indexed and listed in a manifest as
   extraction does.
2. Loader rate: every sample read whole and verified (``ShardReader.get``) by 1, 2, 4 and 8 threads, GB/s,
   from the page cache and, with ``--drop-caches`` (root, a machine of your own), from the disk.
3. Side by side, alternating rounds: the training loop's step fed by the loop's own loader (``prefetch`` of
   ``collate``: read, verify, pad in ``train.loader_threads`` threads) vs the same batches already in host
   memory (no read, no hash); tokens/s and the ratio.
4. The weight fingerprint (``file_digests``) of ``--weights-gib`` GiB in 2 GiB files: from the page cache,
   from the disk (``--drop-caches``), and a cached rerun.

    PYTHONPATH=src python benchmarks/verified_reads.py [--samples 48] [--steps 300] [--rounds 2] [--weights-gib 10]
        [--threads 4] [--skip-train] [--drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

H, K, SEQ = 4096, 3, 2048


def capture():
    """A Llama-3.1-8B-shaped capture spec (the reads do not depend on its values, only on its shape)."""
    from eaglebox.shards.contract import CaptureSpec

    return CaptureSpec.model_validate({
        "engine": "sglang", "engine_version": "0.5.23", "architecture": "LlamaForCausalLM", "layer_rule": "plus_one",
        "layer_ids": [1, 15, 28], "captured_layer_inputs": [2, 16, 29], "hidden_size": H, "num_layers": 32,
        "dtype": "bfloat16", "dtype_bytes": 2,
        "target": {"config_sha256": "c" * 64, "tokenizer_sha256": "t" * 64, "weights_digest": "w" * 64,
                   "weights_algorithm": "sha256-tree-16MiB"},
        "engine_options": {"quantization": None, "dtype": "bfloat16", "attention_backend": None,
                           "moe_runner_backend": None, "kv_cache_dtype": None, "tp": 1, "dp": 1, "ep": 1}})


DROP = False


def drop_caches() -> bool:
    """Empty the page cache (every process's on this machine: only with ``--drop-caches``)."""
    if not DROP:
        return False
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def write_shards(out: Path, n: int, shard_size: int = 16) -> None:
    import torch

    from eaglebox.capture.sink import write_sample
    from eaglebox.shards.format import FORMAT, save_manifest, shard_dir, shard_name, write_index

    spec = capture()
    g = torch.Generator().manual_seed(0)
    aux, last = torch.randn(SEQ, K * H, generator=g).bfloat16(), torch.randn(SEQ, H, generator=g).bfloat16()
    shards = []
    for si in range(0, n, shard_size):
        folder = out / shard_dir(si // shard_size)
        folder.mkdir(parents=True)
        samples, ids_all = [], []
        for i in range(si, min(n, si + shard_size)):
            ids = torch.randint(0, 128256, (SEQ,), generator=g).tolist()
            aux[0, 0] = i  # every sample's bytes its own
            digest, _, _ = write_sample(folder / f"{i:08d}.safetensors", ids, [aux], [last], spec.sample_header())
            samples.append({"id": f"{i:08d}", "file": f"{folder.name}/{i:08d}.safetensors",
                            "offset": len(ids_all) * SEQ, "rows": SEQ, "sha256": digest})
            ids_all.append(ids)
        digest, size = write_index(out / shard_name(si // shard_size), ids_all, [[1] * SEQ] * len(ids_all),
                                   [s["id"] for s in samples], spec)
        shards.append({"file": shard_name(si // shard_size), "sha256": digest, "bytes": size, "samples": samples})
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": shards})


def loader_rate(shards: Path, cold: bool) -> list[dict]:
    from eaglebox.shards.format import ShardReader
    from eaglebox.train.data import prefetch

    reader = ShardReader(shards)
    nbytes = sum((shards / s["file"]).stat().st_size for sh in reader.manifest["shards"] for s in sh["samples"])
    out = []
    for threads in (1, 2, 4, 8):
        if cold and not drop_caches():
            return out
        t0 = time.perf_counter()
        for _ in prefetch(reader.get, range(len(reader)), threads):
            pass
        dt = time.perf_counter() - t0
        out.append({"loader": "cold" if cold else "page cache", "threads": threads, "gb_per_s": round(nbytes / dt / 1e9, 2)})
        print(json.dumps(out[-1]), flush=True)
    return out


def side_by_side(shards: Path, steps: int, rounds: int, threads: int) -> dict:
    import torch
    from train_throughput import big_spec, eaglebox_step, synthetic

    from eaglebox.shards.format import ShardReader
    from eaglebox.train.data import collate, prefetch

    reader = ShardReader(shards)
    _, head, embed, d2t, t2d = synthetic(SEQ, torch.device("cuda"))
    step, _ = eaglebox_step(big_spec(), embed, d2t, t2d, head, 7, SEQ, graphs=True)
    order = [i % len(reader) for i in range(steps)]
    batches = {i: collate(reader, [i], SEQ, 1) for i in set(order)}  # host memory: one batch a sample
    in_memory = [batches[i] for i in order]

    def run(batches) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in batches:
            step({k: v.to("cuda", non_blocking=True) for k, v in b.items()})
        torch.cuda.synchronize()
        return steps * SEQ / (time.perf_counter() - t0)

    for b in in_memory[:3]:  # warm-up: compile, graph capture
        step({k: v.to("cuda") for k, v in b.items()})
    rates = {"in memory (no read, no hash)": [], f"loader, verified ({threads} threads)": []}
    for _ in range(rounds):
        rates["in memory (no read, no hash)"].append(run(in_memory))
        rates[f"loader, verified ({threads} threads)"].append(
            run(b for _, b in prefetch(lambda i: collate(reader, [i], SEQ, 1), order, threads)))
    med = {k: statistics.median(v) for k, v in rates.items()}
    base, verified = med.values()
    out = {"tokens_per_s": {k: [round(x) for x in v] for k, v in rates.items()}, "ratio_of_medians": round(verified / base, 4)}
    print(json.dumps(out), flush=True)
    return out


def fingerprint(weights_gib: int, root: Path) -> list[dict]:
    import torch

    from eaglebox.target import fingerprint as fp

    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    d = root / "weights"
    d.mkdir()
    files = []
    block = torch.randint(0, 256, (1 << 30,), dtype=torch.uint8).numpy().tobytes()
    for i in range(weights_gib // 2):
        f = d / f"model-{i:05d}.safetensors"
        with open(f, "wb") as fh:
            fh.write(block)
            fh.write(block[::-1])
        old = time.time_ns() - 3600 * 10**9
        os.utime(f, ns=(old, old))  # as a downloaded checkpoint: not just written
        files.append(f)
    out = []
    for what in ("disk (caches dropped)", "page cache", "cached rerun"):
        if what.startswith("disk") and not drop_caches():
            continue
        if what != "cached rerun":
            fp.cache_path().unlink(missing_ok=True)
        t0 = time.perf_counter()
        fp.file_digests(files)
        out.append({"fingerprint": what, "gib": weights_gib, "threads": os.cpu_count(),
                    "s": round(time.perf_counter() - t0, 3)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    # 300: the loader's start (its first sample read and verified by one thread, ~0.1 s on the H100 host) is
    # a run's cost once; in a 30-step round it matched the whole 4.5 % gap (benchmarks/results/data-path-h100-*)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--weights-gib", type=int, default=10)
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--drop-caches", action="store_true")
    args = ap.parse_args()
    global DROP
    DROP = args.drop_caches
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_shards(root / "shards", args.samples)
        print(json.dumps({"wrote_samples": args.samples, "s": round(time.perf_counter() - t0, 1)}), flush=True)
        loader_rate(root / "shards", cold=False)
        loader_rate(root / "shards", cold=True)
        if not args.skip_train:
            side_by_side(root / "shards", args.steps, args.rounds, args.threads)
        fingerprint(args.weights_gib, root)


if __name__ == "__main__":
    main()
