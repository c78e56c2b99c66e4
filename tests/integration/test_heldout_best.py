"""Held-out simulated acceptance during training, on shards of the tiny target captured by real SGLang:
the gate's evaluator scores the held-out split, and a checkpoint made worse on purpose after the best
evaluation is not the draft that is exported."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import ROOT, TINY_CONFIG

pytestmark = pytest.mark.sglang  # the shards come from a real server

COMMON = ["train.batch_size=8", "train.max_length=320", "train.log_every=5", "train.ttt_length=3",
          "train.warmup_steps=2", "train.lr=3e-3", "train.heldout_share=0.25", "train.eval_every=12",
          "train.eval_max_samples=12", "train.checkpoint_every=12", "train.epochs=100"]


def train(shards, out, *extra):
    r = subprocess.run([sys.executable, "-m", "eaglebox.cli", "train", "--config", str(TINY_CONFIG),
                        f"extract.output_dir={shards}", f"train.output_dir={out}", *COMMON, *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def evals(out):
    return {r["step"]: r for r in map(json.loads, (out / "evals.jsonl").read_text().splitlines())}


def test_heldout_al_is_logged_and_a_worse_last_checkpoint_is_not_exported(tiny_shards, tmp_path):
    out = tmp_path / "run"
    train(tiny_shards, out, "train.max_steps=36")
    ev = evals(out)
    assert sorted(ev) == [0, 12, 24, 36]  # step 0 (untrained control), every 12 steps, the last step
    for r in ev.values():
        assert r["requests"] == 12 and r["num_steps"] == 3 and len(r["accept_rate_per_position"]) == 3
        assert 1 <= r["accept_length"] <= 4
    best = max((r for s, r in ev.items() if s > 0), key=lambda r: r["accept_length"])
    assert best["accept_length"] > ev[0]["accept_length"] + 0.2  # training helps on samples never trained on
    report = json.loads((out / "report.json").read_text())
    n = report["heldout_samples"] + report["train_samples"]
    assert n >= 60 and report["heldout_samples"] == round(0.25 * n)
    assert report["exported"] == "best" and report["best"]["step"] == best["step"]
    assert (out / "curves.png").stat().st_size > 10_000

    # Make the newest checkpoint worse on purpose (its weights drowned in noise), then resume: the
    # run's last evaluation scores the damaged weights, and draft/ stays the best evaluation's export.
    best_draft = load_file(out / "draft-best" / "model.safetensors")
    ckpt = out / "checkpoints" / "step-00000036" / "model.safetensors"
    w = load_file(ckpt)
    g = torch.Generator().manual_seed(0)
    save_file({k: v + 3 * v.float().std() * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
               for k, v in w.items()}, ckpt)
    r = train(tiny_shards, out, "train.max_steps=37")
    assert "resumed from" in r.stdout + r.stderr
    ev2 = evals(out)
    assert sorted(ev2) == [0, 12, 24, 36, 37]
    assert ev2[37]["accept_length"] < best["accept_length"] - 0.2
    report = json.loads((out / "report.json").read_text())
    assert report["exported"] == "best" and report["exported_step"] == best["step"]
    exported = load_file(out / "draft" / "model.safetensors")
    assert exported.keys() == best_draft.keys() and all(torch.equal(exported[k], best_draft[k]) for k in exported)
    last = load_file(out / "draft-last" / "model.safetensors")
    assert not torch.equal(last["midlayer.self_attn.q_proj.weight"], exported["midlayer.self_attn.q_proj.weight"])

    # train.export=last exports the damaged weights instead: the choice is the evaluator's, not an accident
    r = train(tiny_shards, out, "train.max_steps=37", "train.export=last")
    exported = load_file(out / "draft" / "model.safetensors")
    assert all(torch.equal(exported[k], last[k]) for k in exported)
