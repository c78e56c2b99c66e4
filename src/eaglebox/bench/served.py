"""Served acceptance and throughput: the same held-out prompts against target + draft and target alone.

AL per request is ``completion_tokens / spec_verify_ct`` from SGLang's response; acceptance per
draft position comes from SGLang's per-request histogram of accepted draft tokens a verify step.
Both are counted on the request, so DP attention (each request in one attention group) leaves them as
they are (docs/conventions.md, "DP attention while serving").
Throughput is completion tokens over wall time at each concurrency level, measured for both
servers with the same engine flags, one after the other on the same machine.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from eaglebox.draft.offline import per_position
from eaglebox.engine.launch import server_for
from eaglebox.shards.spec import engine_version


def histogram_to_accepted(hist: list[int]) -> list[int]:
    """SGLang's ``spec_correct_drafts_histogram`` (count of verify steps by accepted drafts) -> list."""
    return [k for k, n in enumerate(hist) for _ in range(n)]


def run_prompts(url: str, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> dict:
    def one(p):
        r = requests.post(url + "/generate", json={"input_ids": p, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}}, timeout=1800)
        r.raise_for_status()
        return r.json()

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(one, prompts))
    wall = time.monotonic() - t0
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"concurrency": concurrency, "wall_s": round(wall, 3), "completion_tokens": completion,
            "tokens_per_s": round(completion / wall, 2), "outputs": [o["output_ids"] for o in outs],
            "meta": [o["meta_info"] for o in outs]}


def acceptance(meta: list[dict], num_steps: int) -> dict:
    verify = sum(m.get("spec_verify_ct", 0) for m in meta)
    completion = sum(m["completion_tokens"] for m in meta)
    accepted = [a for m in meta for a in histogram_to_accepted(m.get("spec_correct_drafts_histogram") or [])]
    return {"accept_length": completion / verify if verify else None, "verify_ct": verify,
            "completion_tokens": completion,
            "accept_length_per_request": [round(m["completion_tokens"] / m["spec_verify_ct"], 4)
                                          for m in meta if m.get("spec_verify_ct")],
            "accept_rate_per_position": per_position(accepted, num_steps)}


def bench_served(cfg, prompts: list[list[int]], out_dir: Path, log=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    b = cfg.bench
    runs = {}
    if b.url:
        runs["speculative"] = [run_prompts(b.url.rstrip("/"), prompts, b.max_new_tokens, c) for c in b.concurrency]
    else:
        for mode in ("plain", "speculative"):
            with server_for(cfg, mode, out_dir / f"{mode}-server.log") as srv:
                log(f"bench: {mode} server healthy after {srv.startup_s:.1f} s")
                runs[mode] = [run_prompts(srv.url, prompts, b.max_new_tokens, c) for c in b.concurrency]
    spec = runs["speculative"]
    plain = runs.get("plain")
    report = {
        "engine": "sglang", "engine_version": engine_version(), "draft": str(cfg.serve.draft_path),
        "server": b.url or "started by the bench", "num_steps": cfg.serve.num_steps, "eagle_topk": cfg.serve.eagle_topk,
        "num_draft_tokens": cfg.serve.num_draft_tokens, "prompts": len(prompts), "max_new_tokens": b.max_new_tokens,
        "acceptance": acceptance(spec[0]["meta"], cfg.serve.num_steps),
        "outputs_equal_target_greedy": spec[0]["outputs"] == plain[0]["outputs"] if plain else None,
        "throughput": [{"concurrency": s["concurrency"], "speculative_tokens_per_s": s["tokens_per_s"],
                        "target_tokens_per_s": p["tokens_per_s"] if p else None,
                        "speedup": round(s["tokens_per_s"] / p["tokens_per_s"], 3) if p else None}
                       for s, p in zip(spec, plain or [None] * len(spec))],
    }
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_bench(report, out_dir / "bench.png")
    return report


def plot_bench(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = report["acceptance"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].hist(a["accept_length_per_request"], bins=12)
    axes[0].set(title=f"AL per request (mean {a['accept_length']:.2f})", xlabel="completion tokens / verify steps")
    rates = [x or 0.0 for x in a["accept_rate_per_position"]]  # None: position never reached
    axes[1].bar(range(1, len(rates) + 1), rates)
    axes[1].set(title="acceptance per draft position", xlabel="draft position", ylim=(0, 1))
    t = report["throughput"]
    x = range(len(t))
    axes[2].bar([i - 0.2 for i in x], [r["target_tokens_per_s"] or 0 for r in t], width=0.4, label="target alone")
    axes[2].bar([i + 0.2 for i in x], [r["speculative_tokens_per_s"] for r in t], width=0.4, label="EAGLE-3")
    axes[2].set(title="tok/s", xticks=list(x), xticklabels=[f"c={r['concurrency']}" for r in t])
    axes[2].legend()
    fig.suptitle(f"SGLang {report['engine_version']}, steps {report['num_steps']} / topk {report['eagle_topk']} / "
                 f"{report['num_draft_tokens']} draft tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
