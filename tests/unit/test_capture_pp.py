"""Capture under pipeline parallelism (``--pp-size`` in ``engine.extra_args``), against SGLang 0.5.23's own
rules: its rank placement (``compute_dp_attention_world_info``, ``ParallelContext``), its layer split
(``get_pp_indices``) and its own argument check (``handle_aux_hidden_state_capture``).

SGLang delivers no features under PP: only the last stage hooks layers, stages pass on the residual
stream but no aux hidden states, and every stage processes results rebuilt from the pipeline's output
ring without hidden states; it refuses ``--enable-return-aux-hidden-states`` with ``pp_size != 1``.
eaglebox refuses such a capture before a server starts, whichever stages the captured layers live on;
serving a draft under PP stays allowed; the hook would write from the last stage only."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from eaglebox.capture.hook import writes_on_this_rank
from eaglebox.config import load_config
from eaglebox.engine.launch import launch_args, server_for
from eaglebox.errors import EagleboxError
from eaglebox.target.layers import sglang_layer_ids

pytest.importorskip("sglang")
from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture  # noqa: E402
from sglang.srt.distributed import get_pp_indices  # noqa: E402
from sglang.srt.layers.dp_attention import compute_dp_attention_world_info  # noqa: E402
from sglang.srt.runtime_context import ParallelContext  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {
    "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
DEEPSEEK_V3_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                      "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 129280}
KIMI_PRESET = "configs/kimi-k2.5-8x-rtxpro6000.yaml"
"""Its capture.layer_ids are the EAGLE-3 default for 61 layers: inputs of layers 2, 30, 58."""
PP2 = 'engine.extra_args=["--pp-size", "2"]'


def writers(tp_size: int, attn_dp_size: int, pp_size: int) -> list[tuple[int, int]]:
    """(pp_rank, tp_rank) of each scheduler process that writes: one process per stage and TP rank, as
    SGLang launches them, each placed in the attention layout by SGLang's own rule."""
    out = []
    for pp_rank in range(pp_size):
        for tp_rank in range(tp_size):
            attn_tp_rank, attn_tp_size, attn_dp_rank, _ = compute_dp_attention_world_info(tp_rank, tp_size,
                                                                                        attn_dp_size)
            parallel = ParallelContext()
            parallel.override_permanently(tp_size=tp_size, tp_rank=tp_rank, attn_tp_size=attn_tp_size,
                                          attn_tp_rank=attn_tp_rank, attn_dp_rank=attn_dp_rank,
                                          pp_size=pp_size, pp_rank=pp_rank)
            if writes_on_this_rank(parallel):
                out.append((pp_rank, tp_rank))
    return out


@pytest.mark.parametrize(("attn_dp_size", "expected"), [(1, [(1, 0)]), (2, [(1, 0), (1, 2)]),
                                                        (4, [(1, 0), (1, 1), (1, 2), (1, 3)])])
def test_only_the_last_stage_writes_one_rank_per_attention_group(attn_dp_size, expected):
    """TP 4 x PP 2 (8 GPUs): the last stage's attention-TP rank 0 writes; with DP attention each group's
    first rank of the last stage; no rank of stage 0."""
    assert writers(4, attn_dp_size, 2) == expected


def test_one_stage_is_unchanged():
    assert writers(8, 1, 1) == [(0, 0)]
    assert writers(8, 2, 1) == [(0, 0), (0, 4)]
    parallel = ParallelContext()  # the pipeline fields never written: SGLang raises on reading them
    parallel.override_permanently(tp_size=2, tp_rank=0, attn_tp_size=2, attn_tp_rank=0)
    with pytest.raises((RuntimeError, ValueError)):
        parallel.pp_rank  # noqa: B018
    assert writes_on_this_rank(parallel)


def fake_model(tmp_path, cfg: dict):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def sglang_split(layers: int, pp_size: int) -> str:
    return ", ".join(f"stage {r}: layers {a}-{b - 1}"
                     for r, (a, b) in enumerate(get_pp_indices(layers, r, pp_size) for r in range(pp_size)))


@pytest.mark.parametrize("target", [KIMI_CONFIG, DEEPSEEK_V3_CONFIG], ids=["kimi-k2.5", "deepseek-v3"])
def test_a_pp2_capture_of_a_61_layer_target_is_refused_before_a_server_starts(tmp_path, target):
    """Kimi on 8 GPUs as TP 4 x PP 2, the EAGLE-3 default layers (inputs of 2, 30, 58): SGLang puts layer 2
    on stage 0, and delivers none of the three anyway. One error names the key, the layers, SGLang's split
    and what to do; the plain and speculative launches with the same flags are not refused."""
    cfg = load_config(KIMI_PRESET, [f"model.path={fake_model(tmp_path, target)}", "model.tp=4", PP2,
                                    "capture.layer_ids=null"])
    ids = sglang_layer_ids(cfg)
    assert ids == [2, 30, 58]
    assert sglang_split(61, 2) == "stage 0: layers 0-29, stage 1: layers 30-60"
    with pytest.raises(EagleboxError) as err:
        server_for(cfg, "capture", tmp_path / "server.log", capture_dir=tmp_path / "capture", layer_ids=ids)
    message = str(err.value)
    assert message.startswith("engine.extra_args: --pp-size 2 cannot capture features: SGLang 0.5.23 splits ")
    assert (f"61 layers into 2 stages (get_pp_indices) [{sglang_split(61, 2)}]; the capture hooks the inputs of "
            "layers [2, 30, 58], on stages [0, 1, 1]") in message
    assert "drop --pp-size from engine.extra_args (e.g. TP only on the same 8 GPUs, model.tp 8)" in message
    assert "extra_args.pp_size" in message and "serve.allow_provenance_mismatch=true" in message
    assert not (tmp_path / "capture").exists()
    assert "--pp-size" in launch_args(cfg, "speculative") and "--pp-size" in launch_args(cfg, "plain")


def test_layers_all_on_the_last_stage_are_refused_too(tmp_path):
    """SGLang returns no hidden states to any stage under PP: where the layers live does not matter."""
    cfg = load_config(KIMI_PRESET, [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}", "model.tp=4", PP2,
                                    "capture.layer_ids=[40, 50, 58]"])
    with pytest.raises(EagleboxError, match=r"inputs of layers \[40, 50, 58\], on stages \[1, 1, 1\]"):
        launch_args(cfg, "capture", sglang_layer_ids(cfg))


def test_the_split_named_is_sglangs_with_the_servers_partition(tmp_path, monkeypatch):
    """SGLANG_PP_LAYER_PARTITION in engine.env is what the server splits by; this process's is left as it was."""
    monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
    cfg = load_config(KIMI_PRESET, [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}", "model.tp=4", PP2,
                                    'engine.env={"SGLANG_PP_LAYER_PARTITION": "20,41"}'])
    with pytest.raises(EagleboxError, match=r"\[stage 0: layers 0-19, stage 1: layers 20-60\]; the capture hooks "
                                            r"the inputs of layers \[2, 30, 58\], on stages \[0, 1, 1\]"):
        launch_args(cfg, "capture", sglang_layer_ids(cfg))
    assert "SGLANG_PP_LAYER_PARTITION" not in os.environ


def test_pp1_capture_is_unchanged_and_sglang_refuses_what_eaglebox_refuses(tmp_path):
    """Without --pp-size the capture launches as before, and SGLang's own check accepts it; the same
    launch with --pp-size 2 is what SGLang's check refuses."""
    cfg = load_config(KIMI_PRESET, [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}"])
    cap = launch_args(cfg, "capture", sglang_layer_ids(cfg))
    assert "--pp-size" not in cap and "--enable-return-aux-hidden-states" in cap
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    handle_aux_hidden_state_capture(ServerArgs.from_cli_args(parser.parse_args(cap)))
    with pytest.raises(ValueError, match="--enable-return-aux-hidden-states only supports pp_size == 1"):
        handle_aux_hidden_state_capture(ServerArgs.from_cli_args(parser.parse_args([*cap, "--pp-size", "2"])))
