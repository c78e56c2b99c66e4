"""The trainer's kernel check (``eaglebox.train.kernel_check``): kernels equal to the eager references pass
untouched; an attention that drops the later TTT steps' diagonal keys, or a step block that drops the MLP,
is measured off and replaced, and the run report's attention entry says so."""

import pytest
import torch

from eaglebox.draft.spec import DraftSpec
from eaglebox.train import kernel_check, ttt
from eaglebox.train.model import Eagle3Draft

MLA = {"q_lora_rank": 32, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}
CPU = torch.device("cpu")
CHECK = kernel_check.CHECK_TOKENS


def draft(arch: str) -> Eagle3Draft:
    mla = MLA if arch == "deepseek_mla" else {}
    s = DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4,
                  num_key_value_heads=4 if mla else 2, head_dim=24 if mla else 16, intermediate_size=96,
                  vocab_size=128, draft_vocab_size=64, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                  max_position_embeddings=256, architecture=arch, **mla)
    torch.manual_seed(0)
    return Eagle3Draft(s)


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(ttt, "_attention_choices", {})


@pytest.mark.parametrize("arch", ["llama", "deepseek_mla"])
def test_reference_kernels_pass_untouched(arch):
    m = draft(arch)
    r = kernel_check.check_kernels(m, 3, CPU)
    assert r["attention_error"] < 1e-5 and r["steps_error"] < 1e-5, r
    assert "attention" not in r and "steps" not in r and m.attention is ttt.ttt_attention
    assert ttt.attention_choices() == {"cpu": {"check": r}}


@pytest.mark.parametrize("arch", ["llama", "deepseek_mla"])
def test_attention_without_the_diagonal_keys_is_replaced(arch):
    m = draft(arch)
    m.attention = lambda q, keys, values, valid, steps: ttt.ttt_attention(q, keys[:1], values[:1], valid, steps)
    r = kernel_check.check_kernels(m, 3, CPU)
    assert r["attention_error"] > kernel_check.ATTENTION_TOL and m.attention is ttt.ttt_attention
    assert r["steps_error"] < 1e-5  # measured after the replacement
    assert ttt.attention_choices()["cpu"]["kernel"] == "eager" and "replaced by the dense reference" in r["attention"]


def test_a_step_block_without_its_mlp_goes_back_to_eager():
    m = draft("llama")

    def finish(w, h, attn):  # the residual without the MLP
        B, _, T, _ = attn.shape
        r = torch.nn.functional.linear(attn.transpose(1, 2).reshape(B, T, -1), w["o"]) + h
        return r, r
    m.finish = finish
    r = kernel_check.check_kernels(m, 3, CPU)
    assert r["attention_error"] < 1e-5 and r["steps_error"] > kernel_check.STEP_TOL
    assert "finish" not in m.__dict__ and "replaced by the eager ones" in r["steps"]
    assert "gradient of midlayer.mlp.gate_proj.weight" in r["steps_worst"], r  # named where it sits


def test_compiled_blocks_pass_and_stay_compiled():
    """The CUDA path's compiled step blocks (torch.compile runs on the CPU too; flex has no CPU backward, so
    the dense attention) against the eager ones: equal within float32 rounding, so nothing is replaced."""
    m = draft("llama")
    m.compile_steps(2 * CHECK)
    m.attention = ttt.ttt_attention
    compiled = m.qkv
    r = kernel_check.check_kernels(m, 3, CPU)
    assert r["attention_error"] < 1e-4 and r["steps_error"] < 1e-4, r
    assert m.qkv is compiled and "steps" not in r and "attention" not in r
