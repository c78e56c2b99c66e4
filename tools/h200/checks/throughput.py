"""H200 check (c): prefill tokens/s of capture against plain prefill on the same SGLang build and model
(random-weight Llama, hidden 4096, 6 layers; triton attention and torch stand-ins for sgl_kernel, so
absolute numbers say nothing about production kernels). Both servers are up; rounds alternate plain and
capture; a capture round ends when every sample's file is on disk (fsync'd by the server's writers).
Also printed: the disk's raw sequential fsync'd rate, which bounds capture at 32 KiB a token."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

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


def main() -> None:
    from eaglebox.engine.launch import server_for
    from eaglebox.shards.spec import capture_spec

    path = make_llama("wide", 6, WIDE)
    plain_cfg = config_for(path, "tput-plain", 31200, [0, 2, 4], "--disable-radix-cache", chunked_prefill=8192,
                           mem_fraction=0.25)
    cap_cfg = config_for(path, "tput-capture", 31300, [0, 2, 4], chunked_prefill=8192, mem_fraction=0.25)
    # the same capture server with Python's default GIL switch interval (5 ms; the hook's default is 0.5 ms)
    slow_cfg = config_for(path, "tput-capture-5ms", 31400, [0, 2, 4], chunked_prefill=8192, mem_fraction=0.25,
                          env={"EAGLEBOX_CAPTURE_SWITCH_INTERVAL_S": "0.005"})
    spec = capture_spec(cap_cfg)
    staging = {name: WORK / f"tput-staging-{name}" for name in ("capture", "5ms")}
    for d in staging.values():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    prompts = random_prompts(N, LENGTH, LENGTH, seed=3)
    tokens = N * LENGTH
    with server_for(plain_cfg, "plain", OUT / "tput-plain-server.log") as plain, \
         server_for(cap_cfg, "capture", OUT / "tput-capture-server.log", capture_dir=staging["capture"],
                    layer_ids=list(spec.layers.layer_ids)) as cap, \
         server_for(slow_cfg, "capture", OUT / "tput-capture-5ms-server.log", capture_dir=staging["5ms"],
                    layer_ids=list(spec.layers.layer_ids)) as slow:
        timed_round(plain.url, prompts)  # warm-up: kernels compile on first use
        timed_round(cap.url, prompts, staging["capture"])
        timed_round(slow.url, prompts, staging["5ms"])
        rows = []
        for r in range(ROUNDS):
            p = timed_round(plain.url, prompts)
            c = timed_round(cap.url, prompts, staging["capture"])
            n = timed_round(slow.url, prompts, staging["5ms"])
            rows.append({"round": r, "plain_tok_s": tokens / p, "capture_tok_s": tokens / c, "ratio": p / c,
                         "capture_5ms_tok_s": tokens / n, "ratio_5ms": p / n})
            print(f"round {r}: plain {tokens / p:,.0f} tok/s, capture {tokens / c:,.0f} tok/s ({p / c:.2f}x), "
                  f"capture with a 5 ms switch interval {tokens / n:,.0f} tok/s ({p / n:.2f}x)", flush=True)
    bpt = 4 * spec.hidden_size * 2
    disk = raw_disk_rate(tokens * bpt)
    for key, what in (("ratio", "capture"), ("ratio_5ms", "capture, 5 ms switch interval")):
        ratios = [r[key] for r in rows]
        print(f"{what}/plain median {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x over {ROUNDS} rounds")
    print(f"disk {disk / 1e9:.2f} GB/s raw fsync'd = {disk / bpt:,.0f} tok/s at {bpt:,} bytes a token; "
          f"capture median {statistics.median(r['capture_tok_s'] for r in rows) * bpt / 1e9:.2f} GB/s written")
    write_result("throughput", {"rounds": rows, "disk_bytes_per_s": disk, "bytes_per_token": bpt,
                                "prompts": N, "prompt_tokens": LENGTH})
    sys.exit(0)


if __name__ == "__main__":
    main()
