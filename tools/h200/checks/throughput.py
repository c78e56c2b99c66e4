"""H200 check (c): prefill tokens/s of capture against plain prefill on the same SGLang build and model
(random-weight Llama, 6 layers, hidden 4096 or, with ``--hidden 7168``, Kimi-K2.5's width; triton attention
and torch stand-ins for sgl_kernel, so absolute numbers say nothing about production kernels). Every server
is up; rounds alternate plain and each capture variant (the writer process with ``--writers`` threads: 4
and 8, the default since this check measured them: docs/measurements.md, "Measurements behind the code");
a capture round ends when every sample's file is on disk (fsync'd by the server's writers). Also printed:
the disk's raw sequential fsync'd rate, which bounds capture at 4 x hidden x 2 bytes a token.

    bash tools/h200/run.sh throughput [--hidden 7168] [--writers 4 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import requests
from common import OUT, WIDE, WORK, config_for, make_llama, random_prompts, write_result

N, LENGTH, ROUNDS = 64, 2000, 3


def timed_round(url: str, prompts, capture_dir=None) -> float:
    from eaglebox.extract.commit import wait_for_files
    from eaglebox.shards.requests import capture_rid

    def one(i):
        body = {"input_ids": prompts[i], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        if capture_dir is not None:
            body |= {"rid": capture_rid(f"s{i:03d}"), "return_hidden_states": True}
        r = requests.post(url + "/generate", json=body, timeout=600)
        r.raise_for_status()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(N) as pool:
        list(pool.map(one, range(N)))
    if capture_dir is not None:
        wait_for_files([(capture_dir / f"s{i:03d}.safetensors", f"sample {i}") for i in range(N)])
    elapsed = time.perf_counter() - t0
    if capture_dir is not None:
        shutil.rmtree(capture_dir)
        capture_dir.mkdir()
    return elapsed


def raw_disk_rate(nbytes: int) -> float:
    block = os.urandom(64 << 20)
    path = WORK / "raw.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(-(-nbytes // len(block))):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    rate = nbytes / (time.perf_counter() - t0)
    path.unlink()
    return rate


SHAPES = {4096: WIDE, 7168: {"hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 56,
                             "num_key_value_heads": 8}}


def main() -> None:
    from eaglebox.engine.launch import server_for
    from eaglebox.shards.spec import capture_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, choices=sorted(SHAPES), default=4096)
    ap.add_argument("--writers", type=int, nargs="+", default=[4, 8],
                    help="one capture server per count (extract.capture_writers); on an H100 at 7168 only one fits "
                         "beside the plain server")
    args = ap.parse_args()
    hidden = args.hidden
    captures = {f"capture, {n} writers": {"capture_writers": n} for n in args.writers}  # each server's extract keys
    path = make_llama(f"wide{hidden}", 6, SHAPES[hidden])
    plain_cfg = config_for(path, "tput-plain", 31200, [0, 2, 4], "--disable-radix-cache", chunked_prefill=8192,
                           mem_fraction=0.25)
    caps = {name: config_for(path, f"tput-{i}", 31300 + 100 * i, [0, 2, 4], chunked_prefill=8192, mem_fraction=0.25,
                             extract=keys) for i, (name, keys) in enumerate(captures.items())}
    spec = capture_spec(next(iter(caps.values())))
    staging = {name: WORK / f"tput-staging-{i}" for i, name in enumerate(captures)}
    for d in staging.values():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    prompts = random_prompts(N, LENGTH, LENGTH, seed=3)
    tokens = N * LENGTH
    with server_for(plain_cfg, "plain", OUT / "tput-plain-server.log") as plain, ExitStack() as stack:
        servers = {name: stack.enter_context(server_for(cfg, "capture", OUT / f"tput-{i}-server.log",
                                                        capture_dir=staging[name], layer_ids=list(spec.layers.layer_ids)))
                   for i, (name, cfg) in enumerate(caps.items())}
        timed_round(plain.url, prompts)  # warm-up: kernels compile on first use
        for name, srv in servers.items():
            timed_round(srv.url, prompts, staging[name])
        rows = []
        for r in range(ROUNDS):
            p = timed_round(plain.url, prompts)
            row = {"round": r, "plain_tok_s": tokens / p}
            for name, srv in servers.items():
                row[name] = tokens / timed_round(srv.url, prompts, staging[name])
            rows.append(row)
            print(f"round {r}: plain {tokens / p:,.0f} tok/s, " + ", ".join(
                f"{name} {row[name]:,.0f} tok/s ({row[name] / row['plain_tok_s']:.2f}x)" for name in servers), flush=True)
    bpt = 4 * spec.hidden_size * 2
    disk = raw_disk_rate(tokens * bpt)
    bound = min(disk / bpt, statistics.median(r["plain_tok_s"] for r in rows))
    for name in captures:
        ratios = [r[name] / min(disk / bpt, r["plain_tok_s"]) for r in rows]
        print(f"{name} / min(plain, disk): median {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x over "
              f"{ROUNDS} rounds; {statistics.median(r[name] for r in rows) * bpt / 1e9:.2f} GB/s written")
    print(f"disk {disk / 1e9:.2f} GB/s raw fsync'd = {disk / bpt:,.0f} tok/s at {bpt:,} bytes a token; "
          f"min(plain, disk) {bound:,.0f} tok/s")
    write_result(f"throughput-{hidden}", {"rounds": rows, "disk_bytes_per_s": disk, "bytes_per_token": bpt,
                                          "prompts": N, "prompt_tokens": LENGTH, "hidden": hidden,
                                          "captures": captures})
    sys.exit(0)


if __name__ == "__main__":
    main()
