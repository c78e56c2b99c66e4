"""Capture throughput on one SGLang build: plain prefill vs capture to disk vs SGLang's stock JSON.

For each model (the tiny target, and a random-weight twin 1024 wide), one plain server and one
capture server (aux layers on, the eaglebox hook active) run the same prompts with
``max_new_tokens=1`` at the same concurrency, one after the other:

- plain: the plain server, no hidden states;
- capture: the capture server, eaglebox requests (the server writes each sample to disk; a request
  counts when its file is in place);
- json: the capture server, stock ``return_hidden_states`` (the aux rows as JSON floats).

Prints tokens/s and the ratios. ``python benchmarks/capture.py [--prompts 24] [--tokens 1000]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from eaglebox.capture.sink import RID_PREFIX
from eaglebox.config import load_config
from eaglebox.engine.launch import server_for

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
    return [ids[i * tokens : (i + 1) * tokens] for i in range(n)]


def measure(url: str, batch: list[list[int]], mode: str, concurrency: int, staging: Path | None) -> float:
    def one(p):
        body = {"input_ids": p, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        if mode == "capture":
            sid = uuid.uuid4().hex
            body.update(rid=f"{RID_PREFIX}{sid}-0", return_hidden_states=True)
        elif mode == "json":
            body.update(return_hidden_states=True)
        r = requests.post(url + "/generate", json=body, timeout=900)
        r.raise_for_status()
        if mode == "capture":
            path = staging / f"{sid}.safetensors"
            while not path.exists():
                time.sleep(0.002)
            path.unlink()
        elif mode == "json":
            assert len(r.json()["meta_info"]["hidden_states"][0]) == len(p)
        return len(p)

    one(batch[0])  # warm-up
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(one, batch))
    return total / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--port", type=int, default=30310)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tiny = ROOT / ".cache/tiny/target"
    work = Path(tempfile.mkdtemp(prefix="eaglebox-capture-bench-"))
    models = {"tiny (hidden 128)": tiny, "wide (hidden 1024)": wide_twin(tiny, ROOT / ".cache/tiny-wide-1024")}
    batch = prompts(AutoTokenizer.from_pretrained(tiny), a.prompts, a.tokens)
    rows = []
    for name, path in models.items():
        cfg = load_config(ROOT / "configs/tiny-cpu.yaml", [f"model.path={path}", f"engine.port={a.port}",
                                                           "engine.max_total_tokens=32768"])
        res = {}
        with server_for(cfg, "plain", work / "plain.log") as srv:
            res["plain"] = measure(srv.url, batch, "plain", a.concurrency, None)
        staging = work / f"staging-{uuid.uuid4().hex[:6]}"
        with server_for(cfg, "capture", work / "capture.log", capture_dir=staging) as srv:
            res["capture"] = measure(srv.url, batch, "capture", a.concurrency, staging)
            res["json"] = measure(srv.url, batch, "json", a.concurrency, None)
        rows.append((name, res))
        print(json.dumps({"model": name, **{k: round(v, 1) for k, v in res.items()}}), flush=True)
    print(f"\n{a.prompts} prompts x {a.tokens} tokens, concurrency {a.concurrency}, max_new_tokens 1 (tok/s)")
    print(f"{'model':20s} {'plain':>9s} {'capture':>9s} {'json':>9s} {'capture/plain':>14s} {'capture/json':>13s}")
    for name, r in rows:
        print(f"{name:20s} {r['plain']:9.0f} {r['capture']:9.0f} {r['json']:9.0f} {r['capture'] / r['plain']:14.2f} "
              f"{r['capture'] / r['json']:13.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
