"""Aux-layer id conventions, the one function that converts between them, and the one that picks
the layers a run captures.

Two conventions name the same physical tensor with ids that differ by one:

- ``output_of_layer`` (SGLang): ``set_eagle3_layers_to_capture([i])`` captures the residual stream
  *leaving* decoder layer ``i`` (it hooks the input of layer ``i + 1``). SGLang draft configs
  (``eagle_aux_hidden_state_layer_ids``) use this convention.
- ``input_of_layer`` (vLLM runtime, the EAGLE reference trainer): id ``i`` is the residual stream
  *entering* layer ``i``, i.e. the output of layer ``i - 1``.

Every artifact eaglebox writes records the convention next to the ids. Code never adds or subtracts
one by hand: it calls :func:`convert_layer_ids`. A command computes its ids once, with
:func:`sglang_layer_ids` (through the capture spec, :func:`eaglebox.shards.spec.capture_spec`), and
passes them on.
"""

from __future__ import annotations

from typing import Literal

from eaglebox.target.config import num_layers

Convention = Literal["output_of_layer", "input_of_layer"]
SGLANG_CONVENTION: Convention = "output_of_layer"
CONVENTIONS: tuple[Convention, ...] = ("output_of_layer", "input_of_layer")

_OFFSET = {"output_of_layer": 0, "input_of_layer": 1}


def convert_layer_ids(ids: list[int], src: Convention, dst: Convention) -> list[int]:
    """Return ``ids`` (named in convention ``src``) named in convention ``dst``."""
    for name in (src, dst):
        if name not in _OFFSET:
            raise ValueError(f"unknown layer-id convention {name!r}; expected one of {CONVENTIONS}")
    shift = _OFFSET[dst] - _OFFSET[src]
    return [i + shift for i in ids]


def hf_hidden_state_index(sglang_id: int) -> int:
    """Index into HF ``output_hidden_states`` of the tensor SGLang captures for ``sglang_id``.

    HF's tuple starts with the embeddings, so entry ``k`` is the input of layer ``k``.
    """
    return convert_layer_ids([sglang_id], SGLANG_CONVENTION, "input_of_layer")[0]


def default_layer_ids(num_layers: int) -> list[int]:
    """The EAGLE-3 default (inputs of layers 2, n/2, n-3), in SGLang's convention.

    Refuses layer counts for which the default collapses to repeated ids (SGLang would silently
    capture fewer layers): tiny models must name their ids.
    """
    ref = [2, num_layers // 2, num_layers - 3]
    ids = convert_layer_ids(ref, "input_of_layer", SGLANG_CONVENTION)
    if not all(a < b for a, b in zip(ids, ids[1:])) or ids[0] < 0:
        raise ValueError(
            f"the default aux layers {ref} (input_of_layer) are not distinct for a {num_layers}-layer "
            "model; set capture.layer_ids and capture.convention explicitly"
        )
    return ids


def check_layer_ids(ids: list[int], num_layers: int) -> None:
    """Raise ValueError unless ``ids`` (SGLang convention) name distinct, increasing decoder layers."""
    if len(ids) != 3:
        raise ValueError(f"EAGLE-3 needs exactly 3 aux layers, got {ids}")
    if not all(a < b for a, b in zip(ids, ids[1:])):
        raise ValueError(f"aux layer ids must be strictly increasing, got {ids}")
    # SGLang captures a layer's output as the next layer's input: the last layer has no successor.
    if ids[0] < 0 or ids[-1] > num_layers - 2:
        raise ValueError(f"aux layer ids {ids} (output_of_layer) are outside 0..{num_layers - 2}")


def sglang_layer_ids(cfg) -> list[int]:
    """The aux layers ``cfg`` captures, in SGLang's convention (what ``--return-aux-hidden-state-layer-ids``
    takes): ``capture.layer_ids`` converted from ``capture.convention``, or the EAGLE-3 default for the
    target's layer count, checked against it."""
    n = num_layers(cfg.model.path)
    if cfg.capture.layer_ids is None:
        ids = default_layer_ids(n)
    else:
        ids = convert_layer_ids(cfg.capture.layer_ids, cfg.capture.convention, SGLANG_CONVENTION)
    check_layer_ids(ids, n)
    return ids
