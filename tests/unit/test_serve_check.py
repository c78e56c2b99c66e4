"""The serving check that runs inside SGLang (``capture/serve_check.py``), on SGLang 0.5.23's own
``configure_aux_hidden_state_capture`` and its model classes' real ``set_eagle3_layers_to_capture``."""

import importlib
import json
from types import SimpleNamespace

import pytest
import torch

from eaglebox.capture.serve_check import LayerMismatch, patch
from eaglebox.config import load_config
from eaglebox.engine.launch import launch_env


def target(cls, n: int = 6) -> torch.nn.Module:
    """An ``nn.Module`` carrying what the class's setter reads, with the class's real setter bound."""
    t = torch.nn.Module()
    t.model = torch.nn.Module()
    t.model.layers_to_capture = []
    t.pp_group, t.config = SimpleNamespace(is_last_rank=True), SimpleNamespace(num_hidden_layers=n)
    t.set_eagle3_layers_to_capture = cls.set_eagle3_layers_to_capture.__get__(t)
    return t


@pytest.fixture
def configure(monkeypatch):
    """SGLang's configure_aux_hidden_state_capture with the check installed for a draft trained on the
    inputs of layers 2, 3, 4; the module's own function is restored afterwards."""
    from sglang.srt import runtime_context

    module = importlib.import_module("sglang.srt.model_executor.model_runner_components.attention_backend_setup")
    monkeypatch.setattr(module, "configure_aux_hidden_state_capture", module.configure_aux_hidden_state_capture)
    # a fresh process's parallel context (an in-process model load elsewhere in the suite leaves its groups)
    monkeypatch.setattr(runtime_context, "_PARALLEL", runtime_context.ParallelContext())
    monkeypatch.setenv("EAGLEBOX_EXPECT_LAYER_INPUTS", json.dumps([2, 3, 4]))
    patch(module)

    def run(model, ids):
        with runtime_context.get_parallel().override(pp_size=1, pp_rank=0):  # one server process (test_serve_ranks.py: several)
            module.configure_aux_hidden_state_capture(
                model=model, eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=ids,
                dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False)
    return run


def test_the_layers_the_draft_was_trained_on_start(configure):
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.llama import LlamaForCausalLM

    configure(target(DeepseekV3ForCausalLM), [2, 3, 4])  # deepseek_v2 takes ids not starting at 1 as given
    configure(target(LlamaForCausalLM), [1, 2, 3])  # llama adds 1


def test_a_target_that_hooks_other_layers_is_refused(configure):
    """The DeepSeek draft's ids [2, 3, 4] on a class with Llama's rule hook the inputs of 3, 4, 5."""
    from sglang.srt.models.llama import LlamaForCausalLM

    with pytest.raises(LayerMismatch, match=r"hooks the inputs of layers \[3, 4, 5\] .* trained on the inputs "
                                            r"of \[2, 3, 4\]"):
        configure(target(LlamaForCausalLM), [2, 3, 4])


def test_serve_launch_passes_the_drafts_layers(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"eaglebox": {"captured_layer_inputs": [2, 3, 4]}}))
    cfg = load_config("configs/tiny-cpu.yaml", [f"serve.draft_path={draft}"])
    assert json.loads(launch_env(cfg, "speculative")["EAGLEBOX_EXPECT_LAYER_INPUTS"]) == [2, 3, 4]
    assert "EAGLEBOX_EXPECT_LAYER_INPUTS" not in launch_env(cfg, "plain")
