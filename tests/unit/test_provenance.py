"""Serving refuses a draft trained on another target's or engine's features, and says what differs."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eaglebox.config import load_config
from eaglebox.errors import EagleboxError
from eaglebox.target.fingerprint import weights_digest

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 6, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
         "max_position_embeddings": 128, "rope_theta": 10000.0, "torch_dtype": "bfloat16"}


def tiny_target(d, seed: int):
    """A target directory: the same config.json for every seed, weights drawn from ``seed``."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    g = torch.Generator().manual_seed(seed)
    save_file({"model.embed_tokens.weight": torch.randn(100, 64, generator=g),
               "lm_head.weight": torch.randn(100, 64, generator=g)}, d / "model.safetensors")
    (d / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    return d


def cfg_for(tmp_path, model, draft, *overrides):
    p = tmp_path / "serve.yaml"
    p.write_text(f"model:\n  path: {model}\ncapture:\n  layer_ids: [0, 1, 2]\nserve:\n  draft_path: {draft}\n")
    return load_config(p, list(overrides))


def trained_on(tmp_path, cfg):
    """A draft whose provenance is ``cfg``'s capture spec, as training on its shards records it."""
    from eaglebox.draft.export import export_draft
    from eaglebox.draft.spec import draft_spec
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.checkpoint import trainable_state
    from eaglebox.train.model import Eagle3Draft

    spec = capture_spec(cfg)
    draft = draft_spec(cfg.model.path, cfg.train.draft, 3)
    return export_draft(tmp_path / "draft", draft, trainable_state(Eagle3Draft(draft)),
                        spec.provenance(), torch.float32)


def check(cfg):
    from eaglebox.serve.provenance import check_provenance
    from eaglebox.shards.spec import capture_spec

    return check_provenance(cfg.serve, capture_spec(cfg))


def test_a_draft_is_refused_on_a_same_config_target_with_other_weights(tmp_path):
    a, b = tiny_target(tmp_path / "a", 0), tiny_target(tmp_path / "b", 1)
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    draft = trained_on(tmp_path, cfg_for(tmp_path, a, tmp_path / "draft"))
    assert check(cfg_for(tmp_path, a, draft))["mismatches"] == []
    with pytest.raises(EagleboxError, match=r"was trained on features this target and engine do not produce:\n"
                                            r"  target weights \(every byte of the safetensors files and index\): "
                                            r"draft \w{12} vs serving \w{12} \(weights_digest\)\n\("):
        check(cfg_for(tmp_path, b, draft))


def test_other_layers_tokenizer_or_engine_options_are_named(tmp_path):
    a = tiny_target(tmp_path / "a", 0)
    draft = trained_on(tmp_path, cfg_for(tmp_path, a, tmp_path / "draft"))
    with pytest.raises(EagleboxError, match=r"captured_layer_inputs: draft \[1, 2, 3\] vs serving \[2, 3, 4\]\n"
                                            r"  layer_ids: draft \[0, 1, 2\] vs serving \[1, 2, 3\]"):
        check(cfg_for(tmp_path, a, draft, "capture.layer_ids=[1, 2, 3]"))
    with pytest.raises(EagleboxError, match=r"engine option kv_cache_dtype: draft None vs serving 'fp8_e4m3'\n"
                                            r"  engine option tp: draft 1 vs serving 2\n"):
        check(cfg_for(tmp_path, a, draft, "engine.kv_cache_dtype=fp8_e4m3", "model.tp=2"))
    allowed = cfg_for(tmp_path, a, draft, "engine.kv_cache_dtype=fp8_e4m3", "serve.allow_engine_differences=[kv_cache_dtype]")
    assert check(allowed)["mismatches"] == []
    (a / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    with pytest.raises(EagleboxError, match=r"  target tokenizer files: draft \w{12} vs serving \w{12}"):
        check(cfg_for(tmp_path, a, draft))
    (draft / "model.safetensors").unlink()
    with pytest.raises(EagleboxError, match="model.safetensors"):
        check(cfg_for(tmp_path, a, draft, "serve.allow_provenance_mismatch=true"))


def test_weights_fingerprint_reads_the_index(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    save_file({"a": torch.zeros(1000)}, d / "part-1.safetensors")
    save_file({"b": torch.ones(4)}, d / "part-2.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "part-1.safetensors",
                                                                               "b": "part-2.safetensors"}}))
    first = weights_digest(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "part-1.safetensors",
                                                                               "b": "part-2.safetensors", "c": "part-2.safetensors"}}))
    assert weights_digest(d) != first
    (d / "part-2.safetensors").unlink()
    with pytest.raises(EagleboxError, match=r"model.safetensors.index.json names \['part-2.safetensors'\], which"):
        weights_digest(d)


def test_extra_args_are_allowed_to_differ_flag_by_flag_and_only_flags_that_keep_hidden_states(tmp_path):
    from eaglebox.config import ConfigError

    a = tiny_target(tmp_path / "a", 0)
    draft = trained_on(tmp_path, cfg_for(tmp_path, a, tmp_path / "draft"))
    splits = 'engine.extra_args=["--triton-attention-num-kv-splits", "1"]'
    allow = "serve.allow_engine_differences=[extra_args.triton_attention_num_kv_splits]"
    with pytest.raises(EagleboxError, match=r"do not produce:\n  engine option extra_args.triton_attention_num_kv_"
                                            r"splits: draft None vs serving 1\n\("):
        check(cfg_for(tmp_path, a, draft, splits))
    assert check(cfg_for(tmp_path, a, draft, splits, allow))["mismatches"] == []
    both = 'engine.extra_args=["--triton-attention-num-kv-splits", "1", "--prefill-attention-backend", "triton"]'
    with pytest.raises(EagleboxError, match=r"do not produce:\n  engine option extra_args.prefill_attention_backend: "
                                            r"draft None vs serving 'triton'\n\("):
        check(cfg_for(tmp_path, a, draft, both, allow))
    for name in ("extra_args", "extra_args.prefill_attention_backend"):
        with pytest.raises(ConfigError, match=rf"serve.allow_engine_differences.*'{name}' cannot be allowed to differ: "
                                              r"name engine options .* or extra_args flags that cannot change hidden "
                                              r"states \(extra_args.triton_attention_num_kv_splits, "):
            cfg_for(tmp_path, a, draft, f"serve.allow_engine_differences=[{name}]")


@pytest.mark.parametrize("name", ["tiny-cpu-served", "tiny-mla-cpu-served"])
def test_the_shipped_served_configs_allow_only_named_flags(name):
    from conftest import ROOT

    cfg = load_config(ROOT / "configs" / f"{name}.yaml", [])
    assert not any(a == "extra_args" for a in cfg.serve.allow_engine_differences)
