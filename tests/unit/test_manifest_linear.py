"""The manifest is not rewritten after every shard (issue 29 item 3: linear after the capture). Rewriting every
sample's entry after each shard is quadratic in the samples (at 20k samples, 256 a shard: 79 rewrites of up
to 6 MB, ~1 s of JSON each, measured by benchmarks/client_scale.py); the client now rewrites it once the
samples committed since its last write are 1/8 of all it records, at the end, and when the run fails. Samples
staged by the real capture sink, committed by the real client (no server: every sample is already staged)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import config_for_model
from eaglebox.capture.sink import CaptureSink
from eaglebox.extract import commit, run
from eaglebox.extract.plan import Planned, sample_id
from eaglebox.shards.format import MANIFEST, ShardReader, load_manifest
from eaglebox.shards.spec import capture_spec


def stage_all(tiny_target, tmp_path, name: str, n: int):
    """``n`` one-sample shards whose files the real sink has staged; returns (cfg, spec, planned, staging)."""
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    cfg = config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]", f"extract.dataset={data}",
                           f"extract.output_dir={tmp_path / name}", "extract.shard_size=1")
    spec = capture_spec(cfg).model_copy(update={"hidden_size": 8})
    staging = tmp_path / name / commit.STAGING
    sink = CaptureSink(staging, header=spec.sample_header(), writers=1)
    planned = []
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        ids = [3 + i % 7, 4, 5 + i]
        p = Planned(sample_id(ids, spec), i + 1, ids, [0, 1, 1])
        sink.add_chunk(f"eaglebox-{p.id}-0", p.id, ids, torch.randn(3, 24, generator=g).to(torch.bfloat16),
                       torch.randn(3, 8, generator=g).to(torch.bfloat16))
        planned.append(p)
    sink.flush()
    return cfg, spec, planned, staging


def extract(cfg, spec, planned, staging, manifest):
    """The staged samples committed by the run (no server: every file is already staged)."""
    return run.run_extract(cfg.extract, "http://unused", spec, planned, manifest, staging,
                           bound=commit.feature_bound(cfg.model.path), log=lambda *a: None)


def test_manifest_writes_stay_linear_and_every_committed_shard_is_recorded(tiny_target, tmp_path, monkeypatch):
    n = 200
    cfg, spec, planned, staging = stage_all(tiny_target, tmp_path, "out", n)
    writes = []
    real_save = commit.save_manifest

    def save(out, manifest):
        real_save(out, manifest)
        writes.append((len(manifest["shards"]), (out / MANIFEST).stat().st_size))

    monkeypatch.setattr(commit, "save_manifest", save)
    manifest = extract(cfg, spec, planned, staging, None)
    final = (tmp_path / "out" / MANIFEST).stat().st_size
    assert writes[-1] == (n, final)  # the last write records every shard
    assert writes[:8] == [(i + 1, writes[i][1]) for i in range(8)]  # the first shards, one write each
    assert len(writes) < 50  # was 200: one per shard
    assert sum(size for _, size in writes) < 10 * final  # was ~n/2 x final
    on_disk = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert on_disk == manifest and on_disk["samples"] == n and on_disk["tokens"] == 3 * n
    assert [s["file"] for s in on_disk["shards"]] == [f"shard-{i:05d}.safetensors" for i in range(n)]
    assert len(ShardReader(tmp_path / "out")) == n


def test_a_failed_run_records_what_it_committed_and_the_rerun_matches_an_uninterrupted_one(tiny_target, tmp_path,
                                                                                           monkeypatch):
    n = 40
    cfg, spec, planned, staging = stage_all(tiny_target, tmp_path, "ref", n)
    ref = extract(cfg, spec, planned, staging, None)
    cfg, spec, planned, staging = stage_all(tiny_target, tmp_path, "cut", n)
    real_commit = run.commit_shard

    def failing_commit(out, index, *a, **kw):
        if index == 30:
            raise OSError(28, "No space left on device")
        return real_commit(out, index, *a, **kw)

    monkeypatch.setattr(run, "commit_shard", failing_commit)
    with pytest.raises(OSError, match="No space left"):
        extract(cfg, spec, planned, staging, None)
    cut = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert len(cut["shards"]) == 30 and cut["samples"] == 30  # those after the last regular write too
    monkeypatch.setattr(run, "commit_shard", real_commit)

    # killed before the manifest recorded the last shards: the rerun commits them from their shard folders
    cut["shards"] = cut["shards"][:27]
    (tmp_path / "cut" / MANIFEST).write_text(json.dumps(cut))
    resumed = extract(cfg, spec, planned, staging, load_manifest(tmp_path / "cut"))
    assert resumed["shards"] == ref["shards"] and resumed["tokens"] == ref["tokens"] == 3 * n
    assert json.loads((tmp_path / "cut" / MANIFEST).read_text())["shards"] == ref["shards"]
    assert not list(staging.glob("*.safetensors"))
