"""Which aux layers a run captures, and which ids ask SGLang 0.5.23 for them.

The user names the layers they mean (``capture.layer_ids`` in ``capture.convention``):

- ``output_of_layer``: id ``i`` is the residual stream *leaving* decoder layer ``i``;
- ``input_of_layer`` (vLLM, the EAGLE reference): id ``i`` is the stream *entering* layer ``i``.

SGLang's models hook *inputs* of layers (``model.layers_to_capture``; HF's ``hidden_states[i]``), so
eaglebox reasons in inputs. What SGLang is *given* (``--return-aux-hidden-state-layer-ids`` and the
draft config's ``eagle_aux_hidden_state_layer_ids``, both passed to the target class's
``set_eagle3_layers_to_capture``) turns into inputs by a rule that differs per architecture
(:data:`SGLANG_RULES`, tested against SGLang's classes in ``tests/unit/test_layer_rules.py``):

- ``plus_one``: hooks ``i + 1`` for every id (llama, qwen2/3, most models);
- ``first_is_one``: hooks ``i + 1`` when the first id is 1, else the ids as given (deepseek_v2/v3,
  Kimi-K2.5, glm4_moe_lite);
- ``pass_at_num_layers``: the ids as given when ``max(ids) == num_layers``, else ``i + 1`` (gpt_oss).

:func:`sglang_layer_ids` inverts the rule; it is the only function that picks the ids, and each
command calls it once (through the capture spec, :func:`eaglebox.shards.spec.capture_spec`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from eaglebox.errors import EagleboxError
from eaglebox.target.config import architecture, num_layers

Convention = Literal["output_of_layer", "input_of_layer"]
CONVENTIONS: tuple[Convention, ...] = ("output_of_layer", "input_of_layer")
Rule = Literal["plus_one", "first_is_one", "pass_at_num_layers"]

RULES_SGLANG_VERSION = "0.5.23"
SGLANG_RULES: dict[str, tuple[str, Rule]] = {
    "LlamaForCausalLM": ("llama", "plus_one"),
    "MistralForCausalLM": ("mistral", "plus_one"),
    "Qwen2ForCausalLM": ("qwen2", "plus_one"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "plus_one"),
    "Qwen3ForCausalLM": ("qwen3", "plus_one"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "plus_one"),
    "Glm4MoeForCausalLM": ("glm4_moe", "plus_one"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "first_is_one"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "first_is_one"),
    "KimiK25ForConditionalGeneration": ("kimi_k25", "first_is_one"),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "first_is_one"),
    "GptOssForCausalLM": ("gpt_oss", "pass_at_num_layers"),
}
"""HF architecture (``config.json`` ``architectures[0]``) -> (the module under ``sglang.srt.models``
that defines its class, the rule of its ``set_eagle3_layers_to_capture`` in SGLang 0.5.23)."""

RULE_TEXT: dict[Rule, str] = {
    "plus_one": "hooks the input of layer i + 1 for every id i",
    "first_is_one": "hooks the inputs of layers i + 1 when the first id is 1, and of the ids as given otherwise",
    "pass_at_num_layers": "hooks the inputs of the ids as given when their largest is the layer count, "
                          "and of i + 1 otherwise",
}

_OFFSET = {"output_of_layer": 0, "input_of_layer": 1}


def convert_layer_ids(ids: list[int], src: Convention, dst: Convention) -> list[int]:
    """Return ``ids`` (named in convention ``src``) named in convention ``dst``."""
    for name in (src, dst):
        if name not in _OFFSET:
            raise ValueError(f"unknown layer-id convention {name!r}; expected one of {CONVENTIONS}")
    shift = _OFFSET[dst] - _OFFSET[src]
    return [i + shift for i in ids]


def layer_rule(model_path: Path) -> tuple[str, Rule]:
    """(architecture, its SGLang rule); refuses an architecture whose rule eaglebox has not checked."""
    arch = architecture(model_path)
    if arch not in SGLANG_RULES:
        raise EagleboxError(
            f"{Path(model_path) / 'config.json'}: architectures[0] {arch!r}: eaglebox does not know how SGLang "
            f"{RULES_SGLANG_VERSION} turns layer ids into captured layers for it (known: {', '.join(sorted(SGLANG_RULES))}); "
            "to add it, read its set_eagle3_layers_to_capture in sglang/srt/models/, add it to SGLANG_RULES in "
            "eaglebox/target/layers.py, and run tests/unit/test_layer_rules.py, which checks every entry against "
            "SGLang's class")
    return arch, SGLANG_RULES[arch][1]


def captured_inputs(rule: Rule, ids: list[int], num_layers: int) -> list[int]:
    """The layers whose inputs SGLang hooks (``model.layers_to_capture``) when given ``ids``."""
    ids = list(ids)
    as_given = ((rule == "first_is_one" and ids and ids[0] != 1)
                or (rule == "pass_at_num_layers" and ids and max(ids) == num_layers))
    return ids if as_given else [i + 1 for i in ids]


def ids_for_inputs(rule: Rule, inputs: list[int], num_layers: int) -> list[int]:
    """The ids that make SGLang hook the inputs of ``inputs``: the ids as given when the rule keeps
    them, else one less; ValueError when neither does (each rule adds 0 or 1, so nothing else can)."""
    for ids in (list(inputs), [i - 1 for i in inputs]):
        if min(ids) >= 0 and captured_inputs(rule, ids, num_layers) == list(inputs):
            return ids
    raise ValueError(f"SGLang {RULES_SGLANG_VERSION} {RULE_TEXT[rule]}, so no ids make it hook the inputs of {inputs}")


def default_layer_inputs(num_layers: int) -> list[int]:
    """The EAGLE-3 default, inputs of layers 2, n/2 and n-3 (SGLang's own default for every rule)."""
    return [2, num_layers // 2, num_layers - 3]


def check_layer_inputs(inputs: list[int], num_layers: int) -> None:
    """Raise ValueError unless ``inputs`` name three distinct, increasing layer inputs past the embedding."""
    if len(inputs) != 3:
        raise ValueError(f"EAGLE-3 needs exactly 3 aux layers, got {len(inputs)}")
    if not all(a < b for a, b in zip(inputs, inputs[1:])):
        raise ValueError("the aux layers must be strictly increasing")
    if inputs[0] < 1 or inputs[-1] > num_layers - 1:
        raise ValueError(f"inputs of layers 1..{num_layers - 1} (outputs of 0..{num_layers - 2}) can be captured "
                         f"in a {num_layers}-layer model")


def sglang_layer_ids(cfg) -> list[int]:
    """The ids SGLang is given (capture flag and draft config) for the layers ``cfg`` means:
    ``capture.layer_ids`` in ``capture.convention``, or the EAGLE-3 default for the target's layer count."""
    arch, rule = layer_rule(cfg.model.path)
    n = num_layers(cfg.model.path)
    c = cfg.capture
    if c.layer_ids is None:
        inputs = default_layer_inputs(n)
        said = f"unset, the EAGLE-3 default for {n} layers"
    else:
        inputs = convert_layer_ids(c.layer_ids, c.convention, "input_of_layer")
        said = f"{c.layer_ids} ({c.convention})"
    try:
        check_layer_inputs(inputs, n)
        return ids_for_inputs(rule, inputs, n)
    except ValueError as err:
        raise EagleboxError(
            f"capture.layer_ids: {said} means the inputs of layers {inputs} of {arch}: {err}; name other layers "
            "in capture.layer_ids (see docs/conventions.md, 'How to pick layer ids')") from None
