"""The consistency gate: capture -> train -> export -> acceptance on held-out prompts.

One capture server does all the engine work (features for training, greedy continuations and
their features for evaluation). The trained draft must reach ``bench.min_accept_length``; a draft
with random weights and the same vocabulary is the negative control that shows the gate can fail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from eaglebox.bench.collect import collect
from eaglebox.bench.offline import simulate, summarize
from eaglebox.bench.prompts import load_prompts
from eaglebox.bench.sglang_draft import SGLangDraft
from eaglebox.capture.spec import capture_spec
from eaglebox.engine.launch import server_for
from eaglebox.errors import EagleboxError
from eaglebox.export.sglang import export_draft
from eaglebox.extract.client import STAGING, Client, capture, prepare
from eaglebox.extract.dataset import read_chat_template
from eaglebox.shards.format import ShardReader
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.loop import provenance, run_train
from eaglebox.train.model import Eagle3Draft
from eaglebox.train.target import draft_spec, load_embed_and_head
from eaglebox.train.vocab import build_vocab, token_counts

RANDOM_CONTROL_MAX_AL = 1.3


def export_random_draft(cfg, out: Path) -> Path:
    """Same shape and vocabulary as the trained draft, weights as initialised (seeded)."""
    reader = ShardReader(cfg.extract.output_dir)
    spec = draft_spec(cfg.model.path, cfg.train.draft, len(reader.header["layer_ids"]))
    torch.manual_seed(cfg.train.seed + 1)
    model = Eagle3Draft(spec)
    d2t, t2d = build_vocab(token_counts(reader, spec.vocab_size), spec.draft_vocab_size)
    model.d2t.copy_(d2t)
    model.t2d.copy_(t2d)
    return export_draft(out, spec, trainable_state(model), provenance(reader, cfg))


def evaluate(draft_dir: Path, embed: torch.Tensor, samples, num_steps: int, version: str) -> dict:
    draft = SGLangDraft(draft_dir)
    draft.set_embed(embed)
    return summarize([simulate(draft, seq, feats, n, num_steps) for seq, feats, n in samples], num_steps, version)


def run_gate(cfg, log=print) -> dict:
    from transformers import AutoTokenizer

    if cfg.serve.eagle_topk != 1:
        raise EagleboxError("serve.eagle_topk: the offline gate measures chain drafting (topk 1)")
    if cfg.bench.prompts is None or cfg.bench.min_accept_length is None:
        raise EagleboxError("bench.prompts and bench.min_accept_length: required by the gate")
    spec = capture_spec(cfg)
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    plan = prepare(cfg, spec, tok, log)
    prompts = load_prompts(cfg.bench.prompts, tok, cfg.bench.num_prompts,
                           chat_template=read_chat_template(cfg.extract.chat_template))
    out = Path(cfg.bench.output_dir)
    staging = Path(cfg.extract.output_dir) / STAGING
    t0 = time.monotonic()
    timings = {}
    with server_for(cfg, "capture", out / "gate-server.log", capture_dir=staging) as srv:
        timings["server_start_s"] = round(srv.startup_s, 1)
        capture(cfg, srv.url, spec, tok, plan, staging, alive=srv.alive, log=log)
        timings["extract_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        trained = run_train(cfg, spec, log=log)
        timings["train_s"] = round(time.monotonic() - t1, 1)
        t2 = time.monotonic()
        client = Client(srv.url, cfg.extract.max_retries, cfg.extract.retry_backoff_s, srv.alive)
        samples = collect(client, prompts, cfg.bench.max_new_tokens, staging, spec)
    embed, _ = load_embed_and_head(Path(cfg.model.path))
    random_dir = export_random_draft(cfg, Path(cfg.train.output_dir) / "random-draft")
    report = {
        "trained": evaluate(trained, embed, samples, cfg.serve.num_steps, spec["engine_version"]),
        "random_control": evaluate(random_dir, embed, samples, cfg.serve.num_steps, spec["engine_version"]),
        "min_accept_length": cfg.bench.min_accept_length,
        "random_control_max_accept_length": RANDOM_CONTROL_MAX_AL,
    }
    timings["evaluate_s"] = round(time.monotonic() - t2, 1)
    report["timings"] = timings
    report["passed"] = (report["trained"]["accept_length"] >= cfg.bench.min_accept_length
                        and report["random_control"]["accept_length"] <= RANDOM_CONTROL_MAX_AL)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
