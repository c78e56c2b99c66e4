"""The capture contract is one type: a field added to it (here in a subclass, as a new engine option
would be added to the class) is recorded and compared by every check that holds two copies, each
naming it: extraction resume, the staged-sample check, the committed sample and shard index reads,
training's shard check and serving's provenance check. Files written before keep loading."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import small_spec
from eaglebox.capture.sink import CaptureSink
from eaglebox.errors import EagleboxError
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import commit_shard, verify_staged
from eaglebox.extract.plan import Planned, check_resume
from eaglebox.serve.provenance import differences
from eaglebox.shards.contract import CaptureSpec, EngineOptions
from eaglebox.shards.format import FORMAT, ShardError, ShardReader, check_index, read_sample, save_manifest
from eaglebox.train.loop import check_header


class KernelOptions(EngineOptions):
    int4_kernel: str = "marlin"


class WithKernel(CaptureSpec):
    """The spec with one more engine option and one more top-level field."""

    engine_options: KernelOptions
    moe_runner: str = "triton"


def wider(**changes) -> WithKernel:
    return WithKernel.model_validate({**small_spec().as_json(), **changes})


def stage_and_commit(tmp_path, spec: CaptureSpec):
    """One sample staged by the real sink under ``spec``'s header and committed by the client."""
    sink = CaptureSink(tmp_path / "staging", header=spec.sample_header())
    ids = [5, 6, 7]
    sink.add_chunk("eaglebox-a-0", "a", ids, torch.randn(3, 12).bfloat16(), torch.randn(3, 4).bfloat16())
    sink.flush()
    planned = Planned("a", 1, ids, [0, 1, 1])
    out = tmp_path / "out"
    out.mkdir()
    entry = commit_shard(out, 0, [planned], tmp_path / "staging", spec)
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": [entry]})
    return out, entry, planned


def test_diff_names_every_difference_by_dotted_field_and_honours_allow():
    a = small_spec()
    b = small_spec(layer_ids=[1, 2, 3], engine_options={**a.engine_options.model_dump(), "tp": 2})
    assert a.diff(a) == {}
    assert a.diff(b) == {"engine_options.tp": (1, 2), "layer_ids": ([0, 1, 2], [1, 2, 3])}
    assert a.diff(b.as_json(), allow=["engine_options"]) == {"layer_ids": ([0, 1, 2], [1, 2, 3])}
    assert set(a.provenance()) == set(a.as_json()) - {"hidden_size", "num_layers", "dtype", "dtype_bytes"}


@pytest.mark.parametrize("field, value, name", [
    ("moe_runner", "cutlass", "moe_runner"),
    ("engine_options", "int4_kernel", "engine_options.int4_kernel"),
])
def test_a_field_added_to_the_spec_is_seen_by_every_comparison(tmp_path, field, value, name):
    ours = wider()
    if field == "engine_options":
        theirs = wider(engine_options={**ours.engine_options.model_dump(), value: "machete"})
    else:
        theirs = wider(**{field: value})
    assert list(ours.diff(theirs)) == [name]
    out, entry, planned = stage_and_commit(tmp_path, ours)  # shards written under ours

    with pytest.raises(ExtractError, match=rf"{out}: its shards were captured with {name}=.*would capture with {name}="):
        check_resume_with(out, planned, theirs)
    staged = tmp_path / "staging2"
    sink = CaptureSink(staged, header=ours.sample_header())
    sink.add_chunk("eaglebox-a-0", "a", planned.input_ids, torch.randn(3, 12).bfloat16(), torch.randn(3, 4).bfloat16())
    sink.flush()
    with pytest.raises(ExtractError, match=rf"a.safetensors: the server reports {name}=.*the capture spec says {name}="):
        verify_staged(staged / "a.safetensors", planned, theirs)
    with pytest.raises(ShardError, match=rf"a.safetensors: the capture server recorded {name}=.*manifest.json says {name}="):
        read_sample(out / entry["samples"][0]["file"], entry["samples"][0]["sha256"], 3, theirs)
    with pytest.raises(ShardError, match=rf"shard-00000.safetensors: records the capture {name}=.*claims {name}="):
        check_index(out / entry["file"], entry, theirs)
    with pytest.raises(EagleboxError, match=rf"{tmp_path}: shards have {name}=.*the config implies"):
        check_header(ours, theirs, tmp_path)
    label = "engine option int4_kernel" if field == "engine_options" else name
    assert differences(ours.provenance(), theirs, []) == [f"{label}: draft {ours.diff(theirs)[name][0]!r} vs serving "
                                                          f"{ours.diff(theirs)[name][1]!r}"]


def check_resume_with(out, planned, spec):
    return check_resume(SimpleNamespace(output_dir=out, shard_size=1), [planned], spec)


def test_files_written_before_keep_loading_and_unknown_ones_are_refused_in_one_line(tmp_path):
    spec = small_spec()
    out, entry, _ = stage_and_commit(tmp_path, spec)
    reader = ShardReader(out)
    assert reader.capture == spec
    # a sample header as servers wrote it before they were given the spec: compared on what it records
    assert spec.diff_sample_header({"engine": "sglang", "engine_version": "0.5.23", "captured_layer_inputs": [1, 2, 3]}) == {}
    assert list(spec.diff_sample_header({"engine_version": "0.5.22"})) == ["engine_version"]
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["capture"]["engine_options"].pop("ep")  # as an eaglebox that did not record it would have written
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EagleboxError, match=r"manifest.json: its capture spec was written by another eaglebox "
                                            r"\(engine_options.ep not as this one records them\); extract again"):
        ShardReader(out)


def test_the_capture_server_is_given_the_whole_spec(tiny_target, tmp_path):
    from conftest import config_for_model
    from eaglebox.engine.launch import launch_env
    from eaglebox.shards.spec import capture_spec

    cfg = config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]")
    spec = capture_spec(cfg)
    env = launch_env(cfg, "capture", tmp_path, spec.sample_header())
    assert CaptureSpec.model_validate(json.loads(env["EAGLEBOX_CAPTURE_HEADER"])) == spec
