"""The draft's head_dim and RoPE, as SGLang 0.5.23's ``LlamaForCausalLMEagle3`` builds them from the
exported config, against the trainer's; the RoPE guard refuses exactly the blocks on which they differ."""

import json

import pytest
import torch

from eaglebox.config import load_config
from eaglebox.draft.rope import rope_mismatches, yarn_scales
from eaglebox.draft.spec import DraftSpec, draft_spec
from eaglebox.errors import EagleboxError

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
BLOCKS = [  # (block, what it checks)
    (YARN, "plain yarn"),
    ({**YARN, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}, "DeepSeek-V3 / Kimi-K2.5"),
    ({**YARN, "mscale": 0.707, "mscale_all_dim": 0.707}, "equal mscales"),
    ({**YARN, "mscale": 1.0, "mscale_all_dim": 0}, "mscale_all_dim 0, same scale in both"),
    ({**YARN, "mscale": 0.5, "mscale_all_dim": 0}, "mscale_all_dim 0, other scales"),
    ({**YARN, "attention_factor": 0.5}, "attention_factor"),
    ({**YARN, "attention_factor": yarn_scales(YARN)[1]}, "attention_factor equal to SGLang's scale"),
    ({**YARN, "attn_factor": 0.5}, "attn_factor"),
    ({**YARN, "extrapolation_factor": 0.5}, "extrapolation_factor"),
    ({**YARN, "beta_slow": 0}, "beta_slow 0"),
    ({**YARN, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}, "llama3"),
]


def spec_with(rope, head_dim=16) -> DraftSpec:
    return DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=head_dim, intermediate_size=96, vocab_size=100, draft_vocab_size=10, rms_norm_eps=1e-5,
                     rope_theta=10000.0, rope_scaling=dict(rope) if rope else None, max_position_embeddings=128)


def sglang_attention(tmp_path, spec):
    """The attention module of SGLang's draft class, loaded from the exported directory."""
    from eaglebox.draft.export import export_draft
    from eaglebox.draft.sglang_class import SGLangDraft
    from eaglebox.train.checkpoint import trainable_state
    from eaglebox.train.model import Eagle3Draft

    d = export_draft(tmp_path / "draft", spec, trainable_state(Eagle3Draft(spec)), {"layer_ids": [0, 1, 2]},
                     torch.float32)
    return SGLangDraft(d).model.model.layers[0].self_attn


def same_rope(tmp_path, spec) -> bool:
    from eaglebox.train.rope import Rotary

    try:
        cache = sglang_attention(tmp_path, spec).rotary_emb.cos_sin_cache[:96].float()
    except ZeroDivisionError:  # beta_slow 0: SGLang cannot even build it
        return False
    cos, sin = Rotary(spec)(torch.arange(96)[None])
    half = cos.shape[-1] // 2
    if cache.shape[-1] != 2 * half:
        return False
    return torch.allclose(cos[0, :, :half], cache[:, :half], atol=1e-5) and torch.allclose(
        sin[0, :, :half], cache[:, half:], atol=1e-5)


@pytest.mark.parametrize(("block", "what"), BLOCKS, ids=[w for _, w in BLOCKS])
def test_rope_guard_refuses_exactly_what_trainer_and_sglang_read_differently(tmp_path, block, what):
    agree = same_rope(tmp_path, spec_with(block))
    assert (rope_mismatches(dict(block)) == []) == agree, (what, agree, rope_mismatches(dict(block)))


def target(tmp_path, **cfg):
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    base = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
            "max_position_embeddings": 128}
    (d / "config.json").write_text(json.dumps({**base, **cfg}))
    return d


def draft_cfg(tmp_path, *overrides):
    """``train.draft`` of a config with ``overrides``."""
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  path: x\n")
    return load_config(p, list(overrides)).train.draft


def test_head_dim_is_what_sglang_computes_and_never_an_mla_rope_width(tmp_path):
    mla = target(tmp_path, architectures=["DeepseekV3ForCausalLM"], kv_lora_rank=32, qk_rope_head_dim=8, head_dim=8,
                 rope_scaling={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0, "type": "yarn"})
    spec = draft_spec(mla, draft_cfg(tmp_path), 3)
    assert spec.head_dim == 16  # hidden 64 / 4 heads, not qk_rope_head_dim
    attn = sglang_attention(tmp_path, spec)
    assert attn.head_dim == 16 and attn.qkv_proj.weight.shape[0] == (4 + 2 * 2) * 16
    wide = target(tmp_path, head_dim=32)  # a Llama/Qwen3 head wider than hidden / heads: kept
    assert draft_spec(wide, draft_cfg(tmp_path), 3).head_dim == 32
    assert draft_spec(wide, draft_cfg(tmp_path, "train.draft.num_attention_heads=8", "train.draft.num_key_value_heads=8"),
                      3).head_dim == 8


def test_export_refuses_a_config_without_head_dim(tmp_path):
    from eaglebox.draft.export import check_export

    sglang_attention(tmp_path, spec_with(None))
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    del cfg["head_dim"]
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleboxError, match="no head_dim"):
        check_export(tmp_path / "draft")


def test_a_target_rope_block_read_differently_is_refused_naming_file_and_key(tmp_path):
    bad = target(tmp_path, text_config=None)
    hf = json.loads((bad / "config.json").read_text())
    del hf["text_config"]
    (bad / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                 "text_config": {**hf, "rope_scaling": {**YARN, "attn_factor": 0.5}}}))
    with pytest.raises(EagleboxError, match=rf"{bad}/config.json: text_config.rope_scaling: the trainer .* attn_factor: "
                                            r"cos and sin scaled by 1.13863 in the trainer and by 0.569315 in SGLang .*"
                                            r"Set train.draft.rope_scaling"):
        draft_spec(bad, draft_cfg(tmp_path), 3)
    spec = draft_spec(bad, draft_cfg(tmp_path, 'train.draft.rope_scaling={"rope_type": "default"}'), 3)
    assert spec.rope_scaling is None
    with pytest.raises(EagleboxError, match=r"^train.draft.rope_scaling: .*rope_type 'dynamic'"):
        draft_spec(bad, draft_cfg(tmp_path, 'train.draft.rope_scaling={"rope_type": "dynamic", "factor": 2.0}'), 3)


def test_a_draft_rope_block_with_keys_nobody_reads_is_a_config_error(tmp_path):
    from eaglebox.config import ConfigError

    with pytest.raises(ConfigError, match=r"override 'train.draft.rope_scaling=.*': train.draft.rope_scaling: Value error, unknown keys \['factr'\]"):
        draft_cfg(tmp_path, 'train.draft.rope_scaling={"rope_type": "yarn", "factr": 2.0}')
