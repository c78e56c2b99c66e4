"""Serving: inside SGLang, the target's hooked layers checked against the draft's training features.

``eaglebox serve`` sets ``EAGLEBOX_EXPECT_LAYER_INPUTS`` to the layers whose inputs the draft's
features came from (its ``eaglebox`` block). Once SGLang has told the target which layers to capture
for the draft (``configure_aux_hidden_state_capture``, before any CUDA graph is captured), the server
reads them back from the model and refuses to start on a difference: another SGLang build, a rule
eaglebox has wrong (``target/layers.py``), or a draft config edited by hand would otherwise serve a
draft fed features it never saw, at an acceptance near 1 and without an error.

Every scheduler process runs the check on its own model (:func:`checks_on_this_rank`). The layer ids
come from the draft's config.json, the same on every rank; under DP attention (``--attn-dp-size N``,
or the deprecated ``--dp-size N --enable-dp-attention``) every attention-DP group and attention-TP
rank holds the whole layer stack and SGLang hooks the same layers on each, so each rank checks and a
mismatch stops the server whichever rank finds it. Only pipeline stages before the last hook nothing
(SGLang's ``set_eagle3_layers_to_capture`` returns there before setting ``layers_to_capture``): they
are not checked. Tested with SGLang's own rank placement in ``tests/unit/test_serve_ranks.py``.
"""

from __future__ import annotations

import json
import os

from eaglebox.engine.post_import import on_import

AUX_SETUP_MODULE = "sglang.srt.model_executor.model_runner_components.attention_backend_setup"


class LayerMismatch(RuntimeError):
    pass


def layers_to_capture(model) -> list[int] | None:
    """The model's ``layers_to_capture`` (SGLang hooks the inputs of those layers), wherever a wrapper
    nests the decoder stack."""
    for _, module in model.named_modules() if model is not None else ():
        layers = getattr(module, "layers_to_capture", None)
        if layers is not None:
            return [int(i) for i in layers]
    return None


def checks_on_this_rank(parallel) -> bool:
    """Whether this scheduler process checks its model's hooked layers, from SGLang's ``ParallelContext``:
    on the last pipeline stage, every TP, attention-TP and attention-DP rank of it."""
    return parallel.pp_rank == parallel.pp_size - 1


def check_layers(model, expected: list[int], given: list[int] | None) -> None:
    got = layers_to_capture(model)
    if got != expected:
        raise LayerMismatch(
            f"eaglebox: the target {type(model).__name__} hooks the inputs of layers {got} for the draft's "
            f"eagle_aux_hidden_state_layer_ids {given}, but the draft was trained on the inputs of {expected}; "
            "this SGLang build or model class turns layer ids into layers differently from the one that "
            "captured the features. Re-extract and retrain with this build (or restore the draft's config.json).")


def patch(module) -> None:
    from sglang.srt.runtime_context import get_parallel

    stock = module.configure_aux_hidden_state_capture
    expected = json.loads(os.environ["EAGLEBOX_EXPECT_LAYER_INPUTS"])

    def configure_aux_hidden_state_capture(*, model, **kw):
        stock(model=model, **kw)
        if kw.get("eagle_use_aux_hidden_state") and checks_on_this_rank(get_parallel()):
            check_layers(model, expected, kw.get("eagle_aux_hidden_state_layer_ids"))

    module.configure_aux_hidden_state_capture = configure_aux_hidden_state_capture


def install_import_hook() -> None:
    on_import(AUX_SETUP_MODULE, patch)
