"""Shards as the capture path makes them: the real sink writes samples, the client verifies and moves
them into a shard; damaged or foreign files are refused, naming the file."""

import pytest
import torch

from conftest import small_spec
from eaglebox.capture.sink import CaptureSink
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import commit_shard, verify_staged
from eaglebox.extract.plan import Planned
from eaglebox.shards.format import FORMAT, ShardError, ShardReader, save_manifest

SPEC = small_spec()


def staged(tmp_path, samples):
    """Write each (id, ids) through the capture sink; returns the Planned list and the features."""
    sink = CaptureSink(tmp_path / "staging", header={"engine_version": "0.5.23", "captured_layer_inputs": [1, 2, 3]})
    planned, feats = [], {}
    for sid, ids in samples:
        aux, last = torch.randn(len(ids), 12).bfloat16(), torch.randn(len(ids), 4).bfloat16()
        sink.add_chunk(f"eaglebox-{sid}-0", sid, ids, aux, last)
        planned.append(Planned(sid, len(planned) + 1, ids, [0] + [1] * (len(ids) - 1)))
        feats[sid] = (aux, last)
    sink.flush()
    return planned, feats


def committed(tmp_path):
    planned, feats = staged(tmp_path, [("a", [5, 6, 7]), ("b", [8, 9])])
    out = tmp_path / "out"
    out.mkdir()
    entry = commit_shard(out, 0, planned, tmp_path / "staging", SPEC)
    save_manifest(out, {"format": FORMAT, "capture": SPEC.as_json(), "shards": [entry]})
    return out, entry, feats


def test_samples_are_moved_into_their_shard_and_read_back(tmp_path):
    out, entry, feats = committed(tmp_path)
    assert list((tmp_path / "staging").iterdir()) == []  # moved, not copied
    assert [s["file"] for s in entry["samples"]] == ["shard-00000/a.safetensors", "shard-00000/b.safetensors"]
    reader = ShardReader(out, verify=True)
    for i, sid in enumerate("ab"):
        got = reader.get(i)
        assert torch.equal(got["aux"], feats[sid][0]) and torch.equal(got["last"], feats[sid][1])
        ids, mask = reader.ids_and_mask(i)
        assert torch.equal(ids, got["input_ids"]) and mask.tolist()[0] == 0


def test_a_damaged_feature_byte_or_index_is_refused(tmp_path):
    out, entry, _ = committed(tmp_path)
    sample = out / "shard-00000" / "b.safetensors"
    data = bytearray(sample.read_bytes())
    data[-1] ^= 1  # a bit of the last tensor's last row
    sample.write_bytes(bytes(data))
    ShardReader(out)  # not verifying: read as is
    with pytest.raises(ShardError, match="b.safetensors: its tensors' sha256 differs"):
        ShardReader(out, verify=True)
    sample.unlink()
    with pytest.raises(ShardError, match="b.safetensors: listed in manifest.json but missing"):
        ShardReader(out)
    index = out / "shard-00000.safetensors"
    index.write_bytes(index.read_bytes()[:-1] + b"\0")
    with pytest.raises(ShardError, match="shard-00000.safetensors: sha256 differs"):
        ShardReader(out, verify=True)


def test_a_staged_file_that_does_not_answer_the_request_is_refused(tmp_path):
    planned, _ = staged(tmp_path, [("a", [5, 6, 7])])
    path = tmp_path / "staging" / "a.safetensors"
    assert len(verify_staged(path, planned[0], SPEC)) == 64
    with pytest.raises(ExtractError, match="other token ids than were sent for line 1"):
        verify_staged(path, Planned("a", 1, [5, 6, 8], [1, 1, 1]), SPEC)
    with pytest.raises(ExtractError, match=r"do not match the capture spec \(3 x 8"):
        verify_staged(path, planned[0], small_spec(hidden_size=8))
    with pytest.raises(ExtractError, match="the server reports engine_version='0.5.23'"):
        verify_staged(path, planned[0], small_spec(engine_version="0.5.22"))
