import pytest

from eaglebox.target.layers import (
    check_layer_ids,
    convert_layer_ids,
    default_layer_ids,
    hf_hidden_state_index,
)


def test_conversion_between_conventions_is_one_layer_and_invertible():
    # Kimi-K2.5 / DeepSeek-V3 (61 layers): vLLM's [2, 30, 58] are SGLang's [1, 29, 57].
    assert convert_layer_ids([2, 30, 58], "input_of_layer", "output_of_layer") == [1, 29, 57]
    assert convert_layer_ids([1, 29, 57], "output_of_layer", "input_of_layer") == [2, 30, 58]
    assert convert_layer_ids([1, 29, 57], "output_of_layer", "output_of_layer") == [1, 29, 57]


def test_unknown_convention_raises():
    with pytest.raises(ValueError, match="unknown layer-id convention"):
        convert_layer_ids([1], "after", "output_of_layer")


def test_default_matches_eagle_reference_layers():
    # Llama-3.1-8B, 32 layers: EAGLE ref captures inputs of 2, 16, 29 -> SGLang ids 1, 15, 28.
    assert default_layer_ids(32) == [1, 15, 28]
    assert default_layer_ids(61) == [1, 29, 57]
    with pytest.raises(ValueError, match="not distinct"):
        default_layer_ids(4)


def test_hf_index_of_sglang_id():
    assert hf_hidden_state_index(0) == 1  # output of layer 0 = HF hidden_states[1]


def test_check_layer_ids():
    check_layer_ids([0, 1, 2], 4)
    with pytest.raises(ValueError, match="outside"):
        check_layer_ids([0, 1, 3], 4)  # the last layer has no successor to hook
    with pytest.raises(ValueError, match="strictly increasing"):
        check_layer_ids([0, 2, 1], 4)
    with pytest.raises(ValueError, match="exactly 3"):
        check_layer_ids([0, 1], 4)
