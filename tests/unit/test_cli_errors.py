"""User mistakes reach the user as one ``eaglebox`` line naming the config file, the key and the fix,
never a traceback: ``config show`` refuses what the commands would refuse (it validates what it
shows), and the commands refuse it before anything starts. Run as users run the CLI, against the tiny
target's ``config.json`` and a Kimi-shaped (DeepSeek-V3, MLA) one."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, TINY_CONFIG, eaglebox_cli
from eaglebox_dev import tiny_mla

MLA_CONFIG = ROOT / "configs" / "tiny-mla-cpu.yaml"


def refused(*args: str) -> str:
    r = eaglebox_cli(*args, timeout=120)
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # one line
    return r.stderr


@pytest.fixture(scope="module")
def mla_target(tiny_target, tmp_path_factory):
    """A DeepSeek-V3 (Kimi-K2.5 text model) ``config.json`` as ``eaglebox tiny --arch deepseek_v3`` writes it
    (with the tiny tokenizer's size and special ids): all that ``config show`` reads of a target."""
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("mla-target")
    (d / "config.json").write_text(json.dumps(tiny_mla.target_config(AutoTokenizer.from_pretrained(tiny_target))))
    return d


def test_shipped_tiny_configs_show_and_validate(mla_target):
    r = eaglebox_cli("config", "show", str(TINY_CONFIG))
    assert r.returncode == 0 and "layer_ids:\n  - 0\n  - 1\n  - 2" in r.stdout, r.stderr
    r = eaglebox_cli("config", "show", str(MLA_CONFIG), f"model.path={mla_target}")
    assert r.returncode == 0 and "attention_backend: triton" in r.stdout, r.stderr


@pytest.mark.parametrize("ids, why", [
    ("[0,1,9]", r"inputs of layers \[1, 2, 10\] of LlamaForCausalLM: inputs of layers 1..3 \(outputs of 0..2\)"),
    ("[-1,0,1]", r"inputs of layers \[0, 1, 2\] of LlamaForCausalLM: inputs of layers 1..3"),
    ("[1,1,2]", "must be strictly increasing"),
    ("[0,1]", "needs exactly 3 aux layers, got 2"),
])
def test_layer_ids_the_target_lacks(ids, why):
    import re

    err = refused("config", "show", str(TINY_CONFIG), f"capture.layer_ids={ids}")
    assert re.search(why, err), err
    assert err.startswith(f"eaglebox config: {TINY_CONFIG}: capture.layer_ids: ") and "name other layers" in err
    # the commands refuse it the same way, before a server starts
    err = refused("extract", "--config", str(TINY_CONFIG), f"capture.layer_ids={ids}")
    assert err.startswith(f"eaglebox extract: {TINY_CONFIG}: capture.layer_ids: "), err


def test_mla_target_with_torch_native_or_bf16_on_cpu(mla_target):
    err = refused("config", "show", str(MLA_CONFIG), f"model.path={mla_target}", "engine.attention_backend=torch_native")
    assert "engine.attention_backend: torch_native computes DeepseekV3ForCausalLM's MLA attention wrongly" in err
    assert "set it to triton" in err and str(MLA_CONFIG) in err
    err = refused("config", "show", str(MLA_CONFIG), f"model.path={mla_target}", "model.dtype=bfloat16")
    assert "model.dtype: bfloat16 with the triton attention backend on CPU" in err and "model.dtype=float32" in err
    # Llama layer ids on DeepSeek's rule: outputs of layer 0 cannot be asked of it
    err = refused("config", "show", str(MLA_CONFIG), f"model.path={mla_target}", "capture.layer_ids=[0,1,2]")
    assert "capture.layer_ids: [0, 1, 2] (output_of_layer)" in err and "DeepseekV3ForCausalLM" in err


def test_engine_draft_and_target_mistakes(tmp_path):
    err = refused("config", "show", str(TINY_CONFIG), "engine.max_total_tokens=null")
    assert "engine.max_total_tokens: required on CPU" in err and str(TINY_CONFIG) in err
    err = refused("train", "--config", str(TINY_CONFIG), "engine.max_total_tokens=null")  # was a ValueError traceback
    assert err.startswith(f"eaglebox train: {TINY_CONFIG}: engine.max_total_tokens")
    err = refused("config", "show", str(TINY_CONFIG), "train.draft.num_key_value_heads=3")
    assert "train.draft: 4 attention heads are not a multiple of 3 KV heads" in err
    err = refused("config", "show", str(TINY_CONFIG), f"model.path={tmp_path}")
    assert f"model.path: cannot read {tmp_path}/config.json" in err and "set model.path" in err
    (tmp_path / "config.json").write_text("{not json")
    err = refused("config", "show", str(TINY_CONFIG), f"model.path={tmp_path}")
    assert f"model.path: {tmp_path}/config.json is not valid JSON" in err
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    err = refused("config", "show", str(TINY_CONFIG), f"model.path={tmp_path}")
    assert "no num_hidden_layers, num_attention_heads, intermediate_size, vocab_size" in err
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "num_hidden_layers": 4,
                                                      "hidden_size": 64, "num_attention_heads": 4,
                                                      "intermediate_size": 128, "vocab_size": 100}))
    err = refused("config", "show", str(TINY_CONFIG), f"model.path={tmp_path}")
    assert "architectures[0] 'GPT2LMHeadModel'" in err and "SGLANG_RULES" in err


def test_config_errors_stay_one_message_per_key(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(TINY_CONFIG.read_text().replace("  lr: 3.0e-3", "  lr: fast"))
    r = eaglebox_cli("config", "show", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{bad}: line " in r.stderr and "train.lr" in r.stderr
    bad.write_bytes(TINY_CONFIG.read_bytes().replace(b"# The tiny CPU loop", b"# The tiny CPU loop \xff"))
    r = eaglebox_cli("config", "show", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad}: not UTF-8 text (byte 20: b'\\xff'); save the config as UTF-8" in r.stderr


@pytest.mark.parametrize("override, why", [
    ("engine.attention_backend=Triton", "engine.attention_backend: 'Triton' is not a choice of SGLang 0.5.23's "
                                        "--attention-backend; write 'triton'"),
    ("engine.moe_runner_backend=tritonn", "engine.moe_runner_backend: 'tritonn' is not a choice of SGLang 0.5.23's "
                                          "--moe-runner-backend; choose one of auto, "),
])
def test_backend_names_are_checked_against_sglangs_own_choices(override, why):
    err = refused("config", "show", str(TINY_CONFIG), override)
    assert err.startswith(f"eaglebox config: {TINY_CONFIG}: {why}"), err
