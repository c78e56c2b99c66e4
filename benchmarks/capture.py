"""Capture throughput on one SGLang build: plain prefill vs capture to disk vs SGLang's stock JSON.

For each model (the tiny target, and a random-weight twin 1024 wide), one plain server and one
capture server (aux layers on, the eaglebox hook active) are up at once and run the same prompts
with ``max_new_tokens=1`` at the same concurrency, mode after mode, for several alternating rounds
(medians are compared):

- plain: the plain server, no hidden states;
- aux only: the capture server, plain requests (what SGLang's own aux capture costs, before the sink);
- capture: the capture server, eaglebox requests (the server writes each sample to disk; the run
  ends when the last file is in place);
- json: the capture server, stock ``return_hidden_states`` (the aux rows as JSON floats).

Prints tokens/s and the ratios. ``python benchmarks/capture.py [--prompts 24] [--tokens 1000] [--dtype float32]``
(on a CPU without native bf16 matmuls, bf16 prefill is so slow that per-request costs vanish;
float32 shows them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from eaglebox.config import load_config
from eaglebox.engine.launch import server_for
from eaglebox.extract.commit import wait_for_files
from eaglebox.shards.requests import capture_rid
from eaglebox.target.layers import sglang_layer_ids

ROOT = Path(__file__).resolve().parents[1]


def wide_twin(tiny: Path, out: Path, hidden: int = 1024) -> Path:
    """The tiny target's tokenizer and shape, 1024 wide, random weights (throughput only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").exists():
        return out
    cfg = LlamaConfig.from_pretrained(tiny)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads = hidden, 3 * hidden, 16, 4
    cfg.head_dim = hidden // 16
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    for f in tiny.iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    return out


def prompts(tokenizer, n: int, tokens: int) -> list[list[int]]:
    text = " ".join(json.loads(line)["messages"][0]["content"]
                    for line in open(ROOT / ".cache/tiny/data/train.jsonl"))
    ids = tokenizer(text)["input_ids"]
    if len(ids) < n * tokens:
        raise SystemExit(f"the tiny data set has {len(ids)} tokens, fewer than {n} x {tokens}")
    return [ids[i * tokens : (i + 1) * tokens] for i in range(n)]


def measure(url: str, warmup: list[int], batch: list[list[int]], mode: str, concurrency: int,
            staging: Path | None) -> float:
    """Tokens/s over the batch. In capture mode the clock stops when the last file is in place;
    requests do not wait for their own file (as the extraction client does not)."""
    sids = []

    def one(p):
        body = {"input_ids": p, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        if mode == "capture":
            sid = uuid.uuid4().hex
            sids.append(sid)
            body.update(rid=capture_rid(sid, "0"), return_hidden_states=True)
        elif mode == "json":
            body.update(return_hidden_states=True)
        r = requests.post(url + "/generate", json=body, timeout=900)
        r.raise_for_status()
        if mode == "json":
            assert len(r.json()["meta_info"]["hidden_states"][0]) == len(p)
        return len(p)

    def files_in_place():
        wait_for_files([(staging / f"{sid}.safetensors", f"capture {sid}") for sid in sids])

    def unstage():
        for sid in sids:
            (staging / f"{sid}.safetensors").unlink()
        sids.clear()

    one(warmup)  # a prompt outside the batch: the plain server's radix cache must not serve the batch
    if mode == "capture":
        files_in_place()
        unstage()
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(one, batch))
    if mode == "capture":
        files_in_place()
    elapsed = time.monotonic() - t0
    if mode == "capture":
        unstage()
    return total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--port", type=int, default=30310)
    ap.add_argument("--dtype", default="bfloat16", help="model.dtype for both servers")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tiny = ROOT / ".cache/tiny/target"
    work = Path(tempfile.mkdtemp(prefix="eaglebox-capture-bench-"))
    models = {"tiny (hidden 128)": tiny, "wide (hidden 1024)": wide_twin(tiny, ROOT / ".cache/tiny-wide-1024")}
    *batch, warmup = prompts(AutoTokenizer.from_pretrained(tiny), a.prompts + 1, a.tokens)
    rows = []
    for name, path in models.items():
        def cfg(port: int, *extra: str, path: Path = path):
            return load_config(ROOT / "configs/tiny-cpu.yaml", [f"model.path={path}", f"engine.port={port}",
                                                                "engine.max_total_tokens=32768", f"model.dtype={a.dtype}",
                                                                *extra])

        staging = work / f"staging-{uuid.uuid4().hex[:6]}"
        # no radix cache on either server: later rounds repeat the prompts, and a cache hit is no prefill
        plain = server_for(cfg(a.port, 'engine.extra_args=["--disable-radix-cache"]'), "plain", work / "plain.log")
        capture = server_for(cfg(a.port + 1), "capture", work / "capture.log", capture_dir=staging,
                             layer_ids=sglang_layer_ids(cfg(a.port + 1)))
        runs = {"plain": [], "aux only": [], "capture": [], "json": []}
        with plain, capture:  # both up; an idle one sleeps. Rounds alternate, so drift hits all modes alike
            for _ in range(a.rounds):
                runs["plain"].append(measure(plain.url, warmup, batch, "plain", a.concurrency, None))
                runs["aux only"].append(measure(capture.url, warmup, batch, "plain", a.concurrency, None))
                runs["capture"].append(measure(capture.url, warmup, batch, "capture", a.concurrency, staging))
                runs["json"].append(measure(capture.url, warmup, batch, "json", a.concurrency, None))
        res = {mode: statistics.median(v) for mode, v in runs.items()}
        print(json.dumps({"model": name, **{k: [round(x) for x in v] for k, v in runs.items()}}), flush=True)
        rows.append((name, res))
    print(f"\n{a.prompts} prompts x {a.tokens} tokens, {a.dtype}, concurrency {a.concurrency}, max_new_tokens 1; "
          f"median tok/s of {a.rounds} alternating rounds")
    print(f"{'model':20s} {'plain':>9s} {'aux only':>9s} {'capture':>9s} {'json':>9s} {'capture/plain':>14s} "
          f"{'capture/json':>13s}")
    for name, r in rows:
        print(f"{name:20s} {r['plain']:9.0f} {r['aux only']:9.0f} {r['capture']:9.0f} {r['json']:9.0f} "
              f"{r['capture'] / r['plain']:14.2f} {r['capture'] / r['json']:13.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
