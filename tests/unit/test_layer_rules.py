"""eaglebox's layer table (``target/layers.py``) against SGLang 0.5.23's own classes.

For every architecture in the table, the class's real ``set_eagle3_layers_to_capture`` runs on a
stand-in ``self`` (last pipeline rank, a layer count, the decoder stack as a namespace) and what it
stores in ``layers_to_capture`` must be what eaglebox predicts, for every id list; the inverse must
reach every set of layers some ids reach, and refuse exactly the others.
"""

import importlib
import itertools
import json
from types import MethodType, SimpleNamespace

import pytest

from eaglebox.config import load_config
from eaglebox.engine.launch import launch_args
from eaglebox.errors import EagleboxError
from eaglebox.target.layers import (
    SGLANG_RULES,
    captured_inputs,
    default_layer_inputs,
    ids_for_inputs,
    sglang_layer_ids,
)

N = 9
KIMI = "configs/kimi-k2.5-8x-rtxpro6000.yaml"


def stand_in(module, cls, n):
    """A ``self`` for ``cls``'s setter: its decoder stack keeps the real setter of the module's
    ``*Model`` class where it has one (qwen*_moe delegate to it, which marks the layers it hooks: two
    more stand for the ids past the last layer that the brute force tries)."""
    model = SimpleNamespace(layers=[SimpleNamespace() for _ in range(n + 2)], layers_to_capture=[])
    inner = getattr(module, cls.__name__.replace("ForCausalLM", "Model"), None)
    if hasattr(inner, "set_eagle3_layers_to_capture"):
        model.set_eagle3_layers_to_capture = MethodType(inner.set_eagle3_layers_to_capture, model)
    return SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=SimpleNamespace(num_hidden_layers=n),
                           model=model)


def sglang_captures(arch: str, n: int):
    """ids -> the ``layers_to_capture`` SGLang's class for ``arch`` stores (Kimi's wrapper delegates to
    the DeepseekV3ForCausalLM it builds as its language model)."""
    module = importlib.import_module(f"sglang.srt.models.{SGLANG_RULES[arch][0]}")
    cls = getattr(module, arch)

    def run(ids):
        if arch == "KimiK25ForConditionalGeneration":
            lm = stand_in(module, module.DeepseekV3ForCausalLM, n)
            lm.set_eagle3_layers_to_capture = MethodType(module.DeepseekV3ForCausalLM.set_eagle3_layers_to_capture, lm)
            cls.set_eagle3_layers_to_capture(SimpleNamespace(language_model=lm), ids)
            return list(lm.model.layers_to_capture)
        me = stand_in(module, cls, n)
        cls.set_eagle3_layers_to_capture(me, ids)
        return list(me.model.layers_to_capture)
    return run


@pytest.mark.parametrize("arch", sorted(SGLANG_RULES))
def test_table_predicts_what_sglang_captures_and_inverts_it(arch):
    rule = SGLANG_RULES[arch][1]
    real = sglang_captures(arch, N)
    assert real(None) == default_layer_inputs(N)  # SGLang's own default is the EAGLE-3 one eaglebox uses
    reachable = {}
    for ids in itertools.combinations(range(N + 1), 3):  # N: gpt_oss's pass-through case (draft configs only)
        got = real(list(ids))
        assert captured_inputs(rule, list(ids), N) == got, (arch, ids)
        if max(ids) < N:  # what --return-aux-hidden-state-layer-ids accepts
            reachable.setdefault(tuple(got), list(ids))
    for inputs in itertools.combinations(range(1, N), 3):
        if inputs in reachable:
            ids = ids_for_inputs(rule, list(inputs), N)
            assert real(ids) == list(inputs) and max(ids) < N
        else:
            with pytest.raises(ValueError, match="no ids make it hook"):
                ids_for_inputs(rule, list(inputs), N)


def test_only_deepseek_rules_refuse_the_input_of_layer_1_first():
    for _, rule in SGLANG_RULES.values():
        if rule == "first_is_one":
            with pytest.raises(ValueError):
                ids_for_inputs(rule, [1, 4, 7], N)
        else:
            assert ids_for_inputs(rule, [1, 4, 7], N) == [0, 3, 6]


def kimi_target(tmp_path):
    d = tmp_path / "kimi"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
        "vocab_size": 163840, "kv_lora_rank": 512}}))
    return d


@pytest.mark.parametrize(("layers", "convention", "ids"), [
    ([2, 30, 58], "input_of_layer", [2, 30, 58]),  # the recipe: the EAGLE-3 reference layers
    ([1, 29, 57], "output_of_layer", [2, 30, 58]),  # the same layers named by their outputs
    ([2, 30, 58], "output_of_layer", [3, 31, 59]),  # outputs of 2, 30, 58
])
def test_kimi_recipe_says_the_layers_it_means(tmp_path, layers, convention, ids):
    cfg = load_config(KIMI, [f"model.path={kimi_target(tmp_path)}", f"capture.layer_ids={layers}",
                             f"capture.convention={convention}"])
    assert sglang_layer_ids(cfg) == ids
    cap = launch_args(cfg, "capture", ids)
    i = cap.index("--return-aux-hidden-state-layer-ids")
    assert cap[i + 1 : i + 4] == [str(x) for x in ids]
    want = layers if convention == "input_of_layer" else [x + 1 for x in layers]
    assert sglang_captures("KimiK25ForConditionalGeneration", 61)(ids) == want


def test_kimi_refuses_the_output_of_layer_0_first(tmp_path):
    cfg = load_config(KIMI, [f"model.path={kimi_target(tmp_path)}", "capture.layer_ids=[0, 30, 58]",
                             "capture.convention=output_of_layer"])
    with pytest.raises(EagleboxError, match=r"capture.layer_ids: \[0, 30, 58\] \(output_of_layer\) means the inputs "
                                            r"of layers \[1, 31, 59\] of KimiK25ForConditionalGeneration: SGLang 0.5.23 "
                                            r"hooks .* when the first id is 1"):
        sglang_layer_ids(cfg)
