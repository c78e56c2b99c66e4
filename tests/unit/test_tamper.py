"""Files changed on disk after the capture server wrote them: a staged sample (verified by the client
from its header and ids, ``verify_staged``) and a committed one (re-hashed by ``ShardReader(verify=True)``
and by ``eaglebox parity``). Each change is refused with a message naming the file. The files are the
real sink's, the checks the real client's and reader's."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from conftest import small_spec
from eaglebox.capture.sink import CaptureSink
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import commit_shard, verify_staged
from eaglebox.extract.plan import Planned
from eaglebox.shards.format import FORMAT, ShardError, ShardReader, save_manifest

SPEC = small_spec()
IDS = [5, 6, 7, 8]


def stage(tmp_path, sid="a"):
    sink = CaptureSink(tmp_path / "staging", header={"engine_version": "0.5.23", "captured_layer_inputs": [1, 2, 3]})
    sink.add_chunk(f"eaglebox-{sid}-0", sid, IDS, torch.randn(4, 12).bfloat16(), torch.randn(4, 4).bfloat16())
    sink.flush()
    return tmp_path / "staging" / f"{sid}.safetensors", Planned(sid, 1, IDS, [0, 1, 1, 1])


def layout(path):
    """(header json, byte offset of the data) of a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), 8 + n


def patch(path, offset, data: bytes):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def commit(tmp_path, planned):
    out = tmp_path / "out"
    out.mkdir()
    entry = commit_shard(out, 0, planned, tmp_path / "staging", SPEC)
    save_manifest(out, {"format": FORMAT, "capture": SPEC.as_json(), "shards": [entry]})
    return out


def test_staged_token_ids_changed_on_disk(tmp_path):
    path, p = stage(tmp_path)
    header, data = layout(path)
    start = data + header["input_ids"]["data_offsets"][0]
    patch(path, start + 8 * 2, struct.pack("<q", 9))  # the third id: 7 -> 9
    with pytest.raises(ExtractError, match=f"{path}: the server ran other token ids than were sent for line 1"):
        verify_staged(path, p, SPEC)
    with pytest.raises(ExtractError, match="other token ids"):  # and nothing is committed
        commit(tmp_path, [p])
    assert not list((tmp_path / "out").glob("*.safetensors"))


def test_staged_header_changed_on_disk(tmp_path):
    path, p = stage(tmp_path)
    raw = path.read_bytes()
    assert raw.count(b"0.5.23") == 1
    path.write_bytes(raw.replace(b"0.5.23", b"0.5.99"))  # same length: still a valid file
    with pytest.raises(ExtractError, match=f"{path}: the server reports engine_version='0.5.99', the capture spec says "
                                           "engine_version='0.5.23'"):
        verify_staged(path, p, SPEC)
    path.write_bytes(raw.replace(b"[1, 2, 3]", b"[1, 2, 4]"))
    with pytest.raises(ExtractError, match=r"captured_layer_inputs=\[1, 2, 4\]"):
        verify_staged(path, p, SPEC)


def test_staged_features_changed_on_disk_are_refused_once_committed(tmp_path):
    """The client reads no feature bytes (that is the point of hashing once, in the server): a feature
    changed between the server's write and the commit passes ``verify_staged`` and is refused by every
    reader that verifies: ``ShardReader(verify=True)``."""
    path, p = stage(tmp_path)
    header, data = layout(path)
    patch(path, data + header["aux"]["data_offsets"][0] + 3, b"\x7f")
    out = commit(tmp_path, [p])
    ShardReader(out)  # not verifying: read as is
    with pytest.raises(ShardError, match="shard-00000/a.safetensors: its tensors' sha256 differs from manifest.json"):
        ShardReader(out, verify=True)


def test_staged_digest_changed_on_disk_is_refused_once_committed(tmp_path):
    path, p = stage(tmp_path)
    digest = layout(path)[0]["__metadata__"]["sha256"]
    forged = ("0" if digest[0] != "0" else "1") + digest[1:]
    path.write_bytes(path.read_bytes().replace(digest.encode(), forged.encode()))
    assert verify_staged(path, p, SPEC) == forged
    out = commit(tmp_path, [p])
    with pytest.raises(ShardError, match="a.safetensors: its tensors' sha256 differs from manifest.json"):
        ShardReader(out, verify=True)


def test_committed_files_changed_on_disk(tmp_path):
    path, p = stage(tmp_path)
    out = commit(tmp_path, [p])
    sample, index = out / "shard-00000" / "a.safetensors", out / "shard-00000.safetensors"
    header, data = layout(sample)
    good = sample.read_bytes()
    patch(sample, data + header["last"]["data_offsets"][1] - 1, b"\x01")  # the last byte of the last row
    with pytest.raises(ShardError, match="shard-00000/a.safetensors: its tensors' sha256 differs"):
        ShardReader(out, verify=True)
    sample.write_bytes(good)
    ShardReader(out, verify=True)
    header, data = layout(index)
    patch(index, data + header["input_ids"]["data_offsets"][0], struct.pack("<q", 6))  # an id in the index
    with pytest.raises(ShardError, match="shard-00000.safetensors: sha256 differs from manifest.json"):
        ShardReader(out, verify=True)


@pytest.mark.parametrize("which", ["staged", "committed sample", "committed index"])
def test_truncated_files_are_refused_naming_the_file(tmp_path, which):
    path, p = stage(tmp_path)
    if which == "staged":
        path.write_bytes(path.read_bytes()[:-10])
        with pytest.raises(ExtractError, match=str(path)):
            verify_staged(path, p, SPEC)
        return
    out = commit(tmp_path, [p])
    target = out / "shard-00000" / "a.safetensors" if which == "committed sample" else out / "shard-00000.safetensors"
    target.write_bytes(target.read_bytes()[:-10])
    with pytest.raises(ShardError, match=target.name):  # the sample as verify reads it, the index as training does
        ShardReader(out, verify=which == "committed sample")
