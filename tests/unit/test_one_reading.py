"""One reading of the target's config: ``rope_scaling`` beside a ``rope_parameters`` that says otherwise
(transformers 5 and SGLang 0.5.23 run the former, eaglebox's draft would read the latter), or ``dtype``
beside another ``torch_dtype``, is refused in one line naming the file and the keys; blocks that agree,
or one spelling alone, are read as before."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_CONFIG, config_for_model
from eaglebox.cli import check_config
from eaglebox.errors import EagleboxError
from eaglebox.target.config import target_dtype, text_config

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 6, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
         "max_position_embeddings": 128, "torch_dtype": "bfloat16"}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def target(tmp_path, **rope):
    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**LLAMA, **rope}))
    return d


def test_rope_scaling_beside_disagreeing_rope_parameters_is_refused_up_front(tmp_path):
    d = target(tmp_path, rope_scaling=YARN, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with pytest.raises(EagleboxError, match=r"t/config.json: rope_scaling and rope_parameters disagree on factor "
                                            r"\(4.0 vs None\), original_max_position_embeddings \(32 vs None\), "
                                            r"rope_type \('yarn' vs 'default'\); transformers and SGLang 0.5.23 run "
                                            r"rope_scaling, eaglebox would read rope_parameters: keep one of them"):
        check_config(config_for_model(tmp_path, d, "capture.layer_ids=[1, 2, 3]"), TINY_CONFIG)
    d = target(tmp_path, rope_theta=500000.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with pytest.raises(EagleboxError, match=r"rope_theta 500000.0 and rope_parameters.rope_theta 10000.0 disagree"):
        text_config(d)


@pytest.mark.parametrize("rope", [
    {"rope_scaling": YARN, "rope_parameters": {**YARN, "rope_type": "yarn", "rope_theta": 10000.0}},
    {"rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    {"rope_scaling": YARN},
    {"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
])
def test_one_spelling_or_two_that_agree_are_accepted(tmp_path, rope):
    assert text_config(target(tmp_path, **rope))["hidden_size"] == 64


def test_the_shipped_tiny_targets_read_as_before(tiny_target, tiny_mla_target):
    assert text_config(tiny_target)["num_hidden_layers"] == 4
    assert "hidden_size" in text_config(tiny_mla_target)


def test_dtype_beside_another_torch_dtype_is_refused_and_dtype_is_read_first(tmp_path):
    d = target(tmp_path, dtype="float16")  # LLAMA's torch_dtype: bfloat16
    with pytest.raises(EagleboxError, match=r"t/config.json: dtype 'float16' and torch_dtype 'bfloat16' disagree; "
                                            r"transformers 5 and SGLang 0.5.23 run dtype"):
        target_dtype(d, "auto")
    assert target_dtype(d, "float32") == "float32"  # model.dtype set: the checkpoint's is not read
    d = target(tmp_path, dtype="float16", torch_dtype="float16")
    assert target_dtype(d, "auto") == "float16"
