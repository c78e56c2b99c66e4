"""Which scheduler processes check the served target's hooked layers (``capture/serve_check.py``) and what
each finds, with ranks placed by SGLang 0.5.23's own rules (``compute_dp_attention_world_info``, its
``ParallelContext``) and Kimi-K2.5's model classes' real ``set_eagle3_layers_to_capture``: TP 8 with DP
attention over 8 groups (Kimi's serving layout), over 2, and without; and two pipeline stages."""

import importlib
import json
from types import SimpleNamespace

import pytest
import torch

from eaglebox.capture.serve_check import AUX_SETUP_MODULE, LayerMismatch, checks_on_this_rank, patch

pytest.importorskip("sglang")
from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.layers.dp_attention import compute_dp_attention_world_info  # noqa: E402
from sglang.srt.runtime_context import ParallelContext, get_parallel  # noqa: E402

KIMI_LAYERS = 61
DRAFT_IDS = [2, 30, 58]
"""configs/kimi-k2.5-8x-rtxpro6000.yaml's layers: the draft's eagle_aux_hidden_state_layer_ids, which
deepseek_v2's rule hooks as given (the inputs of layers 2, 30, 58)."""


def placements(tp_size: int, attn_dp_size: int, pp_size: int = 1) -> list[dict]:
    """Each scheduler process's ``ParallelContext`` fields, placed by SGLang."""
    out = []
    for pp_rank in range(pp_size):
        for tp_rank in range(tp_size):
            attn_tp_rank, attn_tp_size, attn_dp_rank, dp = compute_dp_attention_world_info(tp_rank, tp_size,
                                                                                         attn_dp_size)
            out.append({"tp_size": tp_size, "tp_rank": tp_rank, "attn_tp_size": attn_tp_size,
                        "attn_tp_rank": attn_tp_rank, "attn_dp_size": dp, "attn_dp_rank": attn_dp_rank,
                        "pp_size": pp_size, "pp_rank": pp_rank})
    return out


def kimi_target(pp_rank: int, pp_size: int) -> torch.nn.Module:
    """Kimi-K2.5's wrapper (``KimiK25ForConditionalGeneration``) around its DeepSeek-V3 language model,
    each with its class's real setter; the pipeline group is SGLang's view of this rank's stage."""
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    lm = torch.nn.Module()
    lm.model = torch.nn.Module()
    lm.model.layers_to_capture = []  # as DeepseekV2Model.__init__ leaves it
    lm.pp_group = SimpleNamespace(is_last_rank=pp_rank == pp_size - 1)
    lm.config = SimpleNamespace(num_hidden_layers=KIMI_LAYERS)
    lm.set_eagle3_layers_to_capture = DeepseekV3ForCausalLM.set_eagle3_layers_to_capture.__get__(lm)
    kimi = torch.nn.Module()
    kimi.language_model = lm
    kimi.set_eagle3_layers_to_capture = KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture.__get__(kimi)
    return kimi


@pytest.fixture(autouse=True)
def own_process(monkeypatch):
    """This process's ``get_parallel()`` as a fresh scheduler process has it before its ranks are written:
    a test that loaded a model in this pytest process (test_mla_draft) left its TP-1 groups built there."""
    monkeypatch.setattr(runtime_context, "_PARALLEL", ParallelContext())


@pytest.fixture
def serve(monkeypatch):
    """``serve(rank, trained_on)``: one scheduler process's ``configure_aux_hidden_state_capture`` (SGLang's,
    with the check installed for a draft trained on the inputs of ``trained_on``) on its own Kimi target,
    under its ``ParallelContext``; returns the layers its target hooks."""
    module = importlib.import_module(AUX_SETUP_MODULE)
    stock = module.configure_aux_hidden_state_capture

    def run(rank: dict, trained_on: list[int]) -> list[int]:
        monkeypatch.setattr(module, "configure_aux_hidden_state_capture", stock)
        monkeypatch.setenv("EAGLEBOX_EXPECT_LAYER_INPUTS", json.dumps(trained_on))
        patch(module)
        model = kimi_target(rank["pp_rank"], rank["pp_size"])
        with get_parallel().override(**rank):
            module.configure_aux_hidden_state_capture(
                model=model, eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=DRAFT_IDS,
                dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False)
        return model.language_model.model.layers_to_capture
    return run


@pytest.mark.parametrize("attn_dp_size", [8, 2, 1])
def test_every_rank_checks_under_dp_attention(serve, attn_dp_size):
    """TP 8 with --attn-dp-size 8 (or --dp-size 8 --enable-dp-attention), 2, or none: every rank of every
    attention group hooks the draft's layers, starts with the draft trained on them, and refuses one
    trained on other layers by itself."""
    ranks = placements(8, attn_dp_size)
    assert sorted({r["attn_dp_rank"] for r in ranks}) == list(range(attn_dp_size))
    for rank in ranks:
        with get_parallel().override(**rank):
            assert checks_on_this_rank(get_parallel())
        assert serve(rank, [2, 30, 58]) == [2, 30, 58]
        with pytest.raises(LayerMismatch, match=r"hooks the inputs of layers \[2, 30, 58\].*trained on the inputs "
                                                r"of \[3, 31, 59\]"):
            serve(rank, [3, 31, 59])


def test_only_the_last_pipeline_stage_hooks_and_checks(serve):
    """TP 4 x PP 2: SGLang hooks no layer on stage 0 (its setter returns first), so stage 0 is not checked
    (it would refuse every draft); stage 1 hooks the draft's layers and is."""
    for rank in placements(4, 1, pp_size=2):
        with get_parallel().override(**rank):
            checked = checks_on_this_rank(get_parallel())
        assert checked == (rank["pp_rank"] == 1)
        if checked:
            assert serve(rank, [2, 30, 58]) == [2, 30, 58]
            with pytest.raises(LayerMismatch):
                serve(rank, [3, 31, 59])
        else:
            assert serve(rank, [2, 30, 58]) == [] and serve(rank, [3, 31, 59]) == []
