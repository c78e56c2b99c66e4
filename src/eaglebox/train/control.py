"""The negative control: a draft of the trained one's shape, vocabulary and provenance with the
trainer's step-0 weights (same seed, same init). Scored or served beside the trained draft, it shows
what training bought; one definition for the gate, the bench and the GPU checks. Made from the trained
draft alone, so a bench needs neither its shards nor its training config."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from eaglebox.draft.export import export_draft, exported_spec
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.model import Eagle3Draft


def export_control_draft(trained: Path, out: Path, seed: int) -> Path:
    """Exports to ``out`` the step-0 draft (``train.seed``) with ``trained``'s vocabulary maps (d2t/t2d)."""
    trained = Path(trained)
    block = json.loads((trained / "config.json").read_text())["eaglebox"]
    block.pop("draft_kv_cache", None)  # export_draft adds it
    spec = exported_spec(trained)
    torch.manual_seed(seed)
    weights = trainable_state(Eagle3Draft(spec))
    maps = load_file(trained / "model.safetensors")
    weights["d2t"], weights["t2d"] = maps["d2t"], maps["t2d"]
    return export_draft(out, spec, weights, block)
