"""Garbage features stop a capture: the known-bad engine combination (Triton's CPU interpreter in bf16) is
refused up front for every architecture, and every captured sample's per-layer largest |value| (recorded
by the real capture sink) is checked by the real client: non-finite, all-zero or beyond 1e7 x the
target's largest embedding value is refused in one line naming the layer and the likely cause."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_CONFIG, config_for_model
from eaglebox.capture.sink import CaptureSink
from eaglebox.cli import check_config
from eaglebox.errors import EagleboxError
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import check_health, commit_shard, feature_bound, verify_staged
from eaglebox.extract.plan import Planned
from eaglebox.shards.spec import capture_spec


def test_triton_in_bf16_on_cpu_is_refused_for_a_llama_target_too(tiny_target, tmp_path):
    cfg = config_for_model(tmp_path, tiny_target, "engine.device=cpu", "engine.max_total_tokens=1024",
                           "capture.layer_ids=[0, 1, 2]", "engine.attention_backend=triton")
    with pytest.raises(EagleboxError, match=r"model.dtype: bfloat16 with the triton attention backend on CPU "
                                            r"\(LlamaForCausalLM\): Triton's interpreter is exact in float32 only .*"
                                            r"set model.dtype=float32 \(or engine.attention_backend=torch_native\)"):
        check_config(cfg, TINY_CONFIG)
    for ok in (["model.dtype=float32"], ["engine.attention_backend=torch_native"], ["engine.device=cuda"]):
        check_config(config_for_model(tmp_path, tiny_target, "engine.device=cpu", "engine.max_total_tokens=1024",
                                      "capture.layer_ids=[0, 1, 2]", "engine.attention_backend=triton", *ok),
                     TINY_CONFIG)


@pytest.fixture()
def staged(tiny_target, tmp_path):
    """Stage a sample of the tiny target's shape through the real sink, with ``aux`` set by the test."""
    cfg = config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]", "model.dtype=float32",
                           "engine.device=cpu", "engine.attention_backend=triton")
    spec = capture_spec(cfg)
    sink = CaptureSink(tmp_path / "staging", header=spec.sample_header())
    ids = [5, 6, 7, 8]

    def stage(sid: str, aux: torch.Tensor) -> Planned:
        sink.add_chunk(f"eaglebox-{sid}-0", sid, ids, aux[:2], torch.randn(2, 128))  # two chunks
        sink.add_chunk(f"eaglebox-{sid}-0", sid, ids, aux[2:], torch.randn(2, 128))
        sink.flush()
        return Planned(sid, 1, ids, [0, 1, 1, 1])

    return stage, spec, feature_bound(tiny_target)


def test_healthy_features_pass_and_garbage_is_refused_naming_the_layer_and_likely_cause(staged, tmp_path):
    stage, spec, bound = staged
    assert 1e6 < bound < 1e7  # 1e7 x the tiny target's largest embedding value (0.29)
    healthy = torch.randn(4, 3 * 128) * 3
    assert len(verify_staged(tmp_path / "staging" / "ok.safetensors", stage("ok", healthy), spec, bound)) == 64
    cause = (r"likely cause: the engine computes this target wrongly with attention backend triton in float32; "
             r"compare a few samples with `eaglebox parity`")
    for sid, (row, col, value), why in (
            ("big", (3, 200, 2e9), r"captured features of the input of layer 2 reach 2e\+09, beyond 2.9\de\+06 "
                                   r"\(1e\+07 x the target's largest embedding value\)"),
            ("nan", (0, 300, float("nan")), r"captured features of the input of layer 3 are not finite \(nan\)"),
            ("inf", (1, 5, float("-inf")), r"captured features of the input of layer 1 are not finite \(inf\)")):
        aux = healthy.clone()
        aux[row, col] = value
        p = stage(sid, aux)
        path = tmp_path / "staging" / f"{sid}.safetensors"
        with pytest.raises(ExtractError, match=f"{path}: {why}; {cause}"):
            verify_staged(path, p, spec, bound)
    zero = healthy.clone()
    zero[:, 128:256] = 0
    p = stage("zero", zero)
    with pytest.raises(ExtractError, match=r"zero.safetensors: captured features of the input of layer 2 are all zero"):
        verify_staged(tmp_path / "staging" / "zero.safetensors", p, spec)  # no bound: finite and zero checks still
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ExtractError, match="are all zero"):
        commit_shard(out, 0, [p], tmp_path / "staging", spec, bound)
    assert not list(out.rglob("*.safetensors"))  # nothing committed


def test_the_likely_cause_names_a_backend_set_through_extra_args(staged, tmp_path):
    """Triton prefill chosen by ``engine.extra_args`` is what the message blames, not only the keyed backend."""
    _, spec, bound = staged
    opts = spec.engine_options.model_copy(update={"extra_args": {"prefill_attention_backend": "triton"}})
    with pytest.raises(ExtractError, match=r"all zero; likely cause: .* attention backend triton, "
                                           r"prefill_attention_backend triton in float32"):
        check_health(tmp_path / "z.safetensors", [0.0, 1.0, 1.0, 1.0],
                     spec.model_copy(update={"engine_options": opts}), bound)


def test_a_sample_left_in_its_shard_folder_is_checked_by_its_bytes(tmp_path):
    """A rerun without the manifest's record of a sample commits the file left in the shard folder only
    once its bytes hash to what it carries (issue 42, finding 2): a flipped byte or a cut-short file is
    refused naming the file, with the advice that recaptures it."""
    from conftest import small_spec
    from eaglebox.capture.sink import write_sample
    from eaglebox.shards.format import shard_dir

    spec = small_spec()
    out, staging = tmp_path / "shards", tmp_path / "staging"
    folder = out / shard_dir(0)
    folder.mkdir(parents=True)
    staging.mkdir()
    ids = [5, 6, 7]
    p = Planned("s0", 1, ids, [0, 1, 1])
    path = folder / "s0.safetensors"
    write_sample(path, ids, [torch.randn(3, 3 * 4).bfloat16()], [torch.randn(3, 4).bfloat16()], spec.sample_header())
    commit_shard(out, 0, [p], staging, spec)  # intact: committed
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40  # a feature byte: the header and the hash it carries are unchanged
    path.write_bytes(bytes(raw))
    with pytest.raises(ExtractError, match=r"s0.safetensors: left in its shard folder by an interrupted run and "
                                           r"damaged since .* delete it and run `eaglebox extract` again"):
        commit_shard(out, 0, [p], staging, spec)
    path.write_bytes(bytes(raw[: len(raw) // 2]))  # cut short: the same advice
    with pytest.raises(ExtractError, match=r"damaged since .*not a complete safetensors file.* delete it and run"):
        commit_shard(out, 0, [p], staging, spec)
