import json

import pytest

from conftest import config_for_model
from eaglebox.errors import EagleboxError
from eaglebox.target.layers import (
    check_layer_inputs,
    convert_layer_ids,
    default_layer_inputs,
    sglang_layer_ids,
)


def test_conversion_between_conventions_is_one_layer_and_invertible():
    # Kimi-K2.5 / DeepSeek-V3 (61 layers): the inputs of 2, 30, 58 are the outputs of 1, 29, 57.
    assert convert_layer_ids([2, 30, 58], "input_of_layer", "output_of_layer") == [1, 29, 57]
    assert convert_layer_ids([1, 29, 57], "output_of_layer", "input_of_layer") == [2, 30, 58]
    assert convert_layer_ids([1, 29, 57], "output_of_layer", "output_of_layer") == [1, 29, 57]


def test_unknown_convention_raises():
    with pytest.raises(ValueError, match="unknown layer-id convention"):
        convert_layer_ids([1], "after", "output_of_layer")


def test_default_is_the_eagle_reference_layers():
    assert default_layer_inputs(32) == [2, 16, 29]
    assert default_layer_inputs(61) == [2, 30, 58]


def test_check_layer_inputs():
    check_layer_inputs([1, 2, 3], 4)
    with pytest.raises(ValueError, match="inputs of layers 1..3"):
        check_layer_inputs([2, 3, 4], 4)  # the last layer's output is no layer's input
    with pytest.raises(ValueError, match="inputs of layers 1..3"):
        check_layer_inputs([0, 1, 2], 4)  # the embedding
    with pytest.raises(ValueError, match="strictly increasing"):
        check_layer_inputs([1, 3, 2], 4)
    with pytest.raises(ValueError, match="exactly 3"):
        check_layer_inputs([1, 2], 4)


def target(tmp_path, arch, n):
    d = tmp_path / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": n, "hidden_size": 64}))
    return d


def test_sglang_layer_ids_follow_the_targets_rule(tmp_path):
    llama, deepseek = target(tmp_path, "LlamaForCausalLM", 32), target(tmp_path, "DeepseekV3ForCausalLM", 32)
    assert sglang_layer_ids(config_for_model(tmp_path, llama)) == [1, 15, 28]  # the default: inputs of 2, 16, 29
    assert sglang_layer_ids(config_for_model(tmp_path, deepseek)) == [2, 16, 29]
    both = ("capture.layer_ids=[1, 15, 28]", "capture.convention=output_of_layer")
    assert sglang_layer_ids(config_for_model(tmp_path, llama, *both)) == [1, 15, 28]
    assert sglang_layer_ids(config_for_model(tmp_path, deepseek, *both)) == [2, 16, 29]


def test_layer_ids_a_model_cannot_hold_or_an_unknown_architecture_are_refused(tmp_path):
    tiny = target(tmp_path, "LlamaForCausalLM", 4)
    with pytest.raises(EagleboxError, match=r"capture.layer_ids: unset, the EAGLE-3 default for 4 layers means the "
                                            r"inputs of layers \[2, 2, 1\] of LlamaForCausalLM: .*strictly increasing"):
        sglang_layer_ids(config_for_model(tmp_path, tiny))
    with pytest.raises(EagleboxError, match=r"capture.layer_ids: \[0, 1, 3\] \(output_of_layer\) .*inputs of layers "
                                            r"1..3"):
        sglang_layer_ids(config_for_model(tmp_path, tiny, "capture.layer_ids=[0, 1, 3]"))
    other = target(tmp_path, "FalconForCausalLM", 8)
    with pytest.raises(EagleboxError, match=r"FalconForCausalLM'.*known: .*DeepseekV3ForCausalLM.*SGLANG_RULES"):
        sglang_layer_ids(config_for_model(tmp_path, other, "capture.layer_ids=[0, 1, 2]"))
