"""Triton's decode KV splits under the interpreter (the CPU served configs): the tiny target alone, served
twice at once with ``--triton-attention-num-kv-splits`` 8 (SGLang's default) and 1, decoding the same
held-out prompts greedily, alternating, for several rounds. Prints each round's wall times and ratio, the
median and the worst, and whether both produced the same tokens.

``python benchmarks/kv_splits.py [--rounds 3] [--prompts 4] [--tokens 48]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

from eaglebox.bench.served import run_prompts
from eaglebox.config import load_config
from eaglebox.engine.launch import server_for
from eaglebox.engine.server import free_port
from eaglebox.extract.prompts import heldout_prompts
from eaglebox.target.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--logs", default="/tmp/kv-splits")
    a = ap.parse_args()
    Path(a.logs).mkdir(parents=True, exist_ok=True)
    cfgs = {n: load_config(ROOT / "configs" / "tiny-cpu-served.yaml",
                           [f"engine.port={free_port()}", f"bench.num_prompts={a.prompts}",
                            f'engine.extra_args=["--triton-attention-num-kv-splits", "{n}"]']) for n in (8, 1)}
    prompts = heldout_prompts(cfgs[8], load_tokenizer(cfgs[8].model))
    with contextlib.ExitStack() as stack:
        urls = {}
        for n, cfg in cfgs.items():  # one after the other: SGLang sizes its pool from free memory at start
            urls[n] = stack.enter_context(server_for(cfg, "plain", Path(a.logs) / f"splits-{n}.log")).url
        ratios, outputs = [], {}
        for r in range(a.rounds):
            wall = {}
            for n in ((8, 1) if r % 2 == 0 else (1, 8)):
                t0 = time.monotonic()
                outputs[n] = run_prompts(urls[n], prompts, a.tokens, 1)["outputs"]
                wall[n] = time.monotonic() - t0
            ratios.append(wall[8] / wall[1])
            print(f"round {r + 1}: splits 8 {wall[8]:.1f} s, splits 1 {wall[1]:.1f} s: {ratios[-1]:.2f}x", flush=True)
    print(f"{a.prompts} prompts x {a.tokens} tokens, greedy, concurrency 1: one split decodes "
          f"{statistics.median(ratios):.2f}x faster (median of {a.rounds}), worst round {min(ratios):.2f}x; "
          f"same tokens: {outputs[8] == outputs[1]}")


if __name__ == "__main__":
    main()
