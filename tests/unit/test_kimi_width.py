"""The Kimi-width target's maker at the smoke width, on the CPU: the config in Kimi's spelling, the
trained layers' placement, and pass-through layers that add exactly nothing (the padded model's logits
equal the shallow one's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglebox_dev.kimi_width import (
    KIMI,
    SMOKE,
    build,
    logits_diff,
    pad_target,
    placement,
    save,
    target_config,
)

SPECIAL = {"bos": 0, "eos": 1, "pad": 2}


def test_config_is_kimis_spelling():
    cfg = target_config(8192, SPECIAL, 10, KIMI)
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "moe_intermediate_size")} == {
        "hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 2048}
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["rope_scaling"]["factor"] == 64.0
    assert cfg["max_position_embeddings"] == 262144
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["n_shared_experts"]) == ("noaux_tc", "sigmoid", 1)
    assert "rope_type" not in cfg["rope_scaling"]  # transformers' additions stay out of the written config


def test_placement_puts_trained_outputs_at_the_default_capture():
    for n in (8, 10, 12, 61):
        at = placement(n)
        assert at[0] == 0 and [i + 1 for i in at[1:]] == [2, n // 2, n - 3]  # inputs of 2, n/2, n-3
    with pytest.raises(ValueError):
        placement(7)


def test_padded_logits_equal_shallow(tmp_path):
    cfg = target_config(64, SPECIAL, 4, SMOKE)
    shallow = save(build(cfg, seed=1), cfg, tmp_path / "shallow", [])
    target = pad_target(shallow, tmp_path / "target", 9, shard_bytes=1 << 20)
    padded = json.loads((target / "config.json").read_text())
    assert padded["num_hidden_layers"] == 9 and padded["rope_scaling"] == cfg["rope_scaling"]
    assert len(list(target.glob("*.safetensors"))) > 1  # sharded, with an index
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in index and "model.layers.2.mlp.gate.weight" in index
    assert logits_diff(shallow, target, dtype=torch.float32) == 0.0
    # the pass-through layers do run: with one of them writing to the residual, the logits move
    from safetensors.torch import load_file, save_file

    f = target / index["model.layers.2.self_attn.o_proj.weight"]
    state = load_file(f)
    state["model.layers.2.self_attn.o_proj.weight"] = torch.full_like(state["model.layers.2.self_attn.o_proj.weight"], 0.05)
    save_file(state, f, metadata={"format": "pt"})
    assert logits_diff(shallow, target, dtype=torch.float32) > 0


def _kimi_check():
    import importlib.util
    import sys

    checks = Path(__file__).resolve().parents[2] / "tools" / "h200" / "checks"
    path = list(sys.path)
    sys.path.insert(0, str(checks))  # kimi.py imports served.py from beside it
    try:
        spec = importlib.util.spec_from_file_location("kimi_check", checks / "kimi.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path  # the checks' common.py and capture.py would shadow other modules
    return mod


@pytest.mark.parametrize(("config", "layers", "widths"), [("h200-kimi.yaml", 10, KIMI), ("kimi-smoke-cpu.yaml", 8, SMOKE)])
def test_check_configs_capture_the_trained_layers_and_build_both_forms(tmp_path, config, layers, widths):
    """Each check config, on the target the maker writes: the captured inputs are those right after the
    trained layers, and both draft forms the check trains pass the draft-shape and RoPE checks."""
    from eaglebox.config import load_config
    from eaglebox.draft.spec import draft_spec
    from eaglebox.target.layers import sglang_layer_ids

    (tmp_path / "config.json").write_text(json.dumps(target_config(8192, SPECIAL, layers, widths)))
    root = Path(__file__).resolve().parents[2]
    kimi = _kimi_check()
    shapes = {}
    for form, overrides in kimi.FORMS.items():
        cfg = load_config(root / "configs" / config, [f"model.path={tmp_path}", *overrides])
        assert sglang_layer_ids(cfg) == [i + 1 for i in placement(layers)[1:]]
        s = draft_spec(cfg.model.path, cfg.train.draft, 3)
        shapes[form] = (s.architecture, s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.kv_lora_rank)
    H, heads = widths["hidden_size"], widths["num_attention_heads"]
    assert shapes == {"llama": ("llama", heads, heads, H // heads, None),
                      "deepseek_mla": ("deepseek_mla", heads, heads,
                                       widths["qk_nope_head_dim"] + widths["qk_rope_head_dim"], widths["kv_lora_rank"])}
