"""The GPU presets cannot run here: they are checked through the SGLang launch commands they produce,
against SGLang 0.5.23's own lists of valid backends; the serve-time provenance check refuses drafts."""

import json

import pytest

from eaglebox.config import load_config
from eaglebox.engine.launch import launch_args
from eaglebox.errors import EagleboxError
from eaglebox.target.layers import sglang_layer_ids

KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {
    "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
                "vocab_size": 128256}


def fake_model(tmp_path, cfg):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def flag(args, name):
    i = args.index(name)
    return args[i + 1]


def test_kimi_preset_names_sm120_backends_and_sglang_layer_ids(tmp_path):
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        DRAFT_ATTENTION_BACKEND_CHOICES,
        MOE_RUNNER_BACKEND_CHOICES,
    )

    cfg = load_config("configs/kimi-k2.5-8x-rtxpro6000.yaml", [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}"])
    cap = launch_args(cfg, "capture", sglang_layer_ids(cfg))
    assert flag(cap, "--tp") == "8"
    assert flag(cap, "--attention-backend") == "triton" and "triton" in ATTENTION_BACKEND_CHOICES
    assert flag(cap, "--moe-runner-backend") == "marlin" and "marlin" in MOE_RUNNER_BACKEND_CHOICES
    i = cap.index("--return-aux-hidden-state-layer-ids")
    assert cap[i + 1 : i + 4] == ["1", "29", "57"]
    assert "--disable-radix-cache" in cap and "--enable-return-aux-hidden-states" in cap
    spec = launch_args(cfg, "speculative")
    assert flag(spec, "--speculative-algorithm") == "EAGLE3"
    assert flag(spec, "--speculative-draft-model-quantization") == "unquant"
    assert flag(spec, "--speculative-draft-attention-backend") in DRAFT_ATTENTION_BACKEND_CHOICES
    assert (flag(spec, "--speculative-num-steps"), flag(spec, "--speculative-eagle-topk"),
            flag(spec, "--speculative-num-draft-tokens")) == ("3", "1", "4")
    # the capture and the serve launch share every engine flag (train as you infer)
    base = cap[: cap.index("--enable-return-aux-hidden-states")]
    assert spec[: len(base)] == base


def test_llama_preset_converts_reference_layer_ids_once(tmp_path):
    cfg = load_config("configs/llama-3.1-8b-1gpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}"])
    cap = launch_args(cfg, "capture", sglang_layer_ids(cfg))
    i = cap.index("--return-aux-hidden-state-layer-ids")
    assert cap[i + 1 : i + 4] == ["1", "15", "28"]  # inputs of 2, 16, 29


def test_cpu_engine_requires_a_token_budget(tmp_path):
    cfg = load_config("configs/tiny-cpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}",
                                                "engine.max_total_tokens=null"])
    with pytest.raises(ValueError, match="engine.max_total_tokens: required on CPU"):
        launch_args(cfg, "plain")


def test_serving_refuses_a_draft_trained_on_other_layers(tmp_path):
    import hashlib

    import torch

    from eaglebox.draft.sglang import export_draft
    from eaglebox.draft.spec import DraftSpec
    from eaglebox.serve.provenance import check_provenance
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.checkpoint import trainable_state
    from eaglebox.train.model import Eagle3Draft

    model = fake_model(tmp_path, {**LLAMA_CONFIG, "num_attention_heads": 4})
    spec = DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=96, vocab_size=100, draft_vocab_size=10, rms_norm_eps=1e-5,
                     rope_theta=1e4, rope_scaling=None, max_position_embeddings=128)
    sha = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    prov = {"engine": "sglang", "engine_version": "0.5.23", "layer_ids": [2, 16, 29], "convention": "output_of_layer",
            "target_config_sha256": sha, "quantization": None}
    draft = export_draft(tmp_path / "draft", spec, trainable_state(Eagle3Draft(spec)), prov, torch.float32)
    cfg = load_config("configs/llama-3.1-8b-1gpu.yaml", [f"model.path={model}", f"serve.draft_path={draft}"])
    with pytest.raises(EagleboxError, match=r"layer_ids: draft \[2, 16, 29\] vs serving \[1, 15, 28\]"):
        check_provenance(cfg, capture_spec(cfg))
    ok = load_config("configs/llama-3.1-8b-1gpu.yaml", [f"model.path={model}", f"serve.draft_path={draft}",
                                                        "capture.layer_ids=[3, 17, 30]"])
    ok_spec = capture_spec(ok)
    assert check_provenance(ok, ok_spec)["mismatches"] == []
    (draft / "model.safetensors").unlink()
    with pytest.raises(EagleboxError, match="model.safetensors"):
        check_provenance(ok, ok_spec)
