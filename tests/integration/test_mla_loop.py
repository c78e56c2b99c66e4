"""The Kimi-K2.5 path on a Kimi-shaped tiny target (DeepSeek-V3: MLA, MoE, yarn RoPE, a tokenizer that is
code in the model directory), through real SGLang 0.5.23 on the CPU with the Triton backend run by its
interpreter in float32 (``configs/tiny-mla-cpu.yaml``):

``eaglebox check`` (captures with regeneration, trains, exports a yarn-RoPE Llama draft, loads it in SGLang's
own draft class and measures offline AL against the random-weights control), then parity of its shards with
HF's fp32 forward (``conftest.mla_loop``).
"""

from __future__ import annotations

import json

import pytest

from conftest import TINY_MLA_CONFIG

pytestmark = pytest.mark.sglang


def _json(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


def test_tiny_mla_tokenizer_is_remote_code(tiny_mla_target):
    """Like Kimi's: loading it without model.trust_remote_code is refused with the key to set."""
    from eaglebox.config import load_config
    from eaglebox.errors import EagleboxError
    from eaglebox.target.tokenizer import load_tokenizer

    cfg = load_config(TINY_MLA_CONFIG, ["model.trust_remote_code=false"])
    with pytest.raises(EagleboxError, match="model.trust_remote_code"):
        load_tokenizer(cfg.model)
    tok = load_tokenizer(load_config(TINY_MLA_CONFIG).model)
    assert type(tok).__name__ == "TinyKimiTokenizer" and not tok.is_fast
    hf = json.loads((tiny_mla_target / "config.json").read_text())
    assert hf["architectures"] == ["DeepseekV3ForCausalLM"] and hf["rope_scaling"]["type"] == "yarn"


def test_mla_capture_matches_hf_and_gate_passes(mla_loop):
    d, steps, times = mla_loop
    r = steps["check"]
    assert (d / "shards" / "manifest.json").exists(), r.stdout[-2000:] + r.stderr[-3000:]
    spec = json.loads((d / "shards" / "manifest.json").read_text())["capture"]
    # outputs of layers 1, 2, 3 (the config) are the inputs of 2, 3, 4; SGLang's deepseek_v2 takes ids as
    # given unless the first is 1, so it is given [2, 3, 4] (a Llama would be given [1, 2, 3])
    assert spec["architecture"] == "DeepseekV3ForCausalLM" and spec["layer_rule"] == "first_is_one"
    assert spec["layer_ids"] == [2, 3, 4] and spec["captured_layer_inputs"] == [2, 3, 4]
    assert spec["engine_options"]["attention_backend"] == "triton" and spec["dtype"] == "float32"

    r = steps["parity"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parity = _json(r.stdout)
    print(json.dumps({"parity": [(x["reference_index"], x["cos"]) for x in parity["aux"]],
                      "last": parity["last"]["cos"]}))
    for layer in parity["aux"]:
        assert layer["cos"] >= 0.9999 and layer["best_reference_index"] == layer["reference_index"], layer
    assert parity["last"]["cos"] >= 0.9999

    r = steps["check"]
    report = json.loads((d / "bench" / "check.json").read_text())
    print(json.dumps({k: report[k]["accept_length"] for k in ("trained", "random_control")}))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert report["trained"]["accept_length"] >= 1.5  # the gate's bench.min_accept_length in the config
    assert report["random_control"]["accept_length"] <= 1.3
    draft = json.loads((d / "train" / "draft" / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert draft["rope_scaling"]["factor"] == 64.0  # the target's yarn block, which SGLang's draft class loaded
