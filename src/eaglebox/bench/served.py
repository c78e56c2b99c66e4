"""Served acceptance and throughput of one request set (``bench/rounds.py`` runs them side by side).

AL per request is ``completion_tokens / spec_verify_ct`` from SGLang's response; acceptance per
draft position comes from SGLang's per-request histogram of accepted draft tokens a verify step.
Both are counted on the request, so DP attention (each request in one attention group) leaves them as
they are (docs/conventions.md, "DP attention while serving").
Throughput is completion tokens over wall time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from eaglebox.draft.offline import per_position


def histogram_to_accepted(hist: list[int]) -> list[int]:
    """SGLang's ``spec_correct_drafts_histogram`` (count of verify steps by accepted drafts) -> list."""
    return [k for k, n in enumerate(hist) for _ in range(n)]


def run_prompts(url: str, prompts: list[list[int]], max_new_tokens: int, concurrency: int, *,
                ignore_eos: bool = False) -> dict:
    """Greedy answers to ``prompts``, ``concurrency`` at a time; ``ignore_eos``: every request decodes
    ``max_new_tokens`` (a decode cost measured on equal lengths)."""
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0} | ({"ignore_eos": True} if ignore_eos else {})

    def one(p):
        r = requests.post(url + "/generate", json={"input_ids": p, "sampling_params": sampling}, timeout=1800)
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


def plot_bench(report: dict, path: Path) -> Path:
    """AL per request and per draft position of the first speculative measurement; speed-up (median
    over rounds) per concurrency for each variant."""
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
    rows = [r for r in report["summary"]["per_variant"] if r["speedup_median"] is not None]
    for name in dict.fromkeys(r["variant"] for r in rows):
        pts = [(r["concurrency"], r["speedup_median"]) for r in rows if r["variant"] == name]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    axes[2].axhline(1.0, color="grey", lw=0.8)
    axes[2].set(title="speed-up vs target alone (median of rounds)", xlabel="concurrency", xscale="log")
    if rows:
        axes[2].legend(fontsize=7)
    fig.suptitle(f"SGLang {report['engine_version']} on {report['device']}, {report['prompts']} prompts, "
                 f"{report['max_new_tokens']} new tokens, greedy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
