"""H200 check (c'): capture with the hook's 0.5 ms GIL switch interval against Python's 5 ms, side by side,
two capture servers only (``throughput.py`` adds plain prefill and needs more device time than a short
call has). Same model, prompts and rounds as ``throughput.py``."""

from __future__ import annotations

import shutil
import statistics
import sys

from common import OUT, WIDE, WORK, config_for, make_llama, random_prompts, write_result
from throughput import LENGTH, ROUNDS, N, timed_round


def main() -> None:
    from eaglebox.engine.launch import server_for
    from eaglebox.shards.spec import capture_spec

    path = make_llama("wide", 6, WIDE)
    cfgs = {"0.5ms": config_for(path, "si-0.5ms", 31300, [0, 2, 4], chunked_prefill=8192, mem_fraction=0.3),
            "5ms": config_for(path, "si-5ms", 31400, [0, 2, 4], chunked_prefill=8192, mem_fraction=0.3,
                              env={"EAGLEBOX_CAPTURE_SWITCH_INTERVAL_S": "0.005"})}
    spec = capture_spec(cfgs["0.5ms"])
    staging = {k: WORK / f"si-staging-{k}" for k in cfgs}
    for d in staging.values():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    prompts = random_prompts(N, LENGTH, LENGTH, seed=3)
    tokens = N * LENGTH
    with server_for(cfgs["0.5ms"], "capture", OUT / "si-0.5ms-server.log", capture_dir=staging["0.5ms"],
                    layer_ids=list(spec.layers.layer_ids)) as fast, \
         server_for(cfgs["5ms"], "capture", OUT / "si-5ms-server.log", capture_dir=staging["5ms"],
                    layer_ids=list(spec.layers.layer_ids)) as slow:
        timed_round(fast.url, prompts, staging["0.5ms"])  # warm-up
        timed_round(slow.url, prompts, staging["5ms"])
        rows = []
        for r in range(ROUNDS):
            a = timed_round(fast.url, prompts, staging["0.5ms"])
            b = timed_round(slow.url, prompts, staging["5ms"])
            rows.append({"round": r, "tok_s_0.5ms": tokens / a, "tok_s_5ms": tokens / b, "ratio": b / a})
            print(f"round {r}: capture 0.5 ms {tokens / a:,.0f} tok/s, 5 ms {tokens / b:,.0f} tok/s, "
                  f"0.5 ms / 5 ms {b / a:.2f}x", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"0.5 ms / 5 ms median {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x over {ROUNDS} rounds")
    write_result("switch_interval", {"rounds": rows, "prompts": N, "prompt_tokens": LENGTH})
    sys.exit(0)


if __name__ == "__main__":
    main()
