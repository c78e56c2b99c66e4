"""The negative control (``eaglebox.train.control``) is made from an exported draft alone: same shape,
vocabulary maps and provenance, the trainer's step-0 weights. Both draft classes, on the shipped tiny
targets."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglebox.config.schema import DraftConfig
from eaglebox.draft.export import export_draft, exported_spec
from eaglebox.draft.spec import draft_spec
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.control import export_control_draft
from eaglebox.train.model import Eagle3Draft

ASSETS = Path(__file__).resolve().parents[2] / "src" / "eaglebox_dev" / "assets"
PROVENANCE = {"engine": "sglang", "engine_version": "0.5.23", "layer_ids": [0, 1, 2], "samples": 7}


@pytest.mark.parametrize("target,draft", [("tiny-target", DraftConfig(draft_vocab_size=256)),
                                          ("tiny-mla-target", DraftConfig(architecture="deepseek_mla", draft_vocab_size=256,
                                                                          rope_scaling={"rope_type": "default"}))])
def test_control_has_the_trained_drafts_shape_maps_and_provenance_and_step0_weights(tmp_path, target, draft):
    spec = draft_spec(ASSETS / target, draft, num_aux=3)
    torch.manual_seed(123)
    trained = Eagle3Draft(spec)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # "trained": away from any seed's init
        trained.d2t.copy_(torch.randint(0, 50, trained.d2t.shape))
        trained.t2d.copy_(torch.rand(trained.t2d.shape) < 0.5)
    export_draft(tmp_path / "trained", spec, trainable_state(trained), PROVENANCE)
    assert exported_spec(tmp_path / "trained") == spec

    export_control_draft(tmp_path / "trained", tmp_path / "control", seed=0)
    assert exported_spec(tmp_path / "control") == spec
    got, want = load_file(tmp_path / "control" / "model.safetensors"), load_file(tmp_path / "trained" / "model.safetensors")
    assert torch.equal(got["d2t"], want["d2t"]) and torch.equal(got["t2d"], want["t2d"])
    torch.manual_seed(0)
    step0 = trainable_state(Eagle3Draft(spec))
    for k, v in got.items():
        if k not in ("d2t", "t2d"):
            assert torch.equal(v, step0[k].to(v.dtype)), k
            assert not torch.equal(v, want[k]), k
    block = json.loads((tmp_path / "control" / "config.json").read_text())["eaglebox"]
    assert block == json.loads((tmp_path / "trained" / "config.json").read_text())["eaglebox"]
