import pytest
import torch
from safetensors import safe_open

from eaglebox.capture.sink import CaptureSink
from eaglebox.shards.requests import sample_id_from_rid
from eaglebox.shards.format import tensor_sha256


def test_rid_parsing():
    assert sample_id_from_rid("eaglebox-abc123-9f00") == "abc123"
    assert sample_id_from_rid("eaglebox-abc") is None
    assert sample_id_from_rid("user-request") is None
    assert sample_id_from_rid(None) is None


def test_interleaved_chunks_of_two_requests_are_assembled_in_order(tmp_path):
    sink = CaptureSink(tmp_path, queue_size=1, header={"engine": "sglang"})
    a_aux, a_last = torch.randn(5, 6).bfloat16(), torch.randn(5, 2).bfloat16()
    b_aux, b_last = torch.randn(3, 6).bfloat16(), torch.randn(3, 2).bfloat16()
    assert sink.add_chunk("a", [1, 2, 3, 4, 5], a_aux[:2], a_last[:2]) is None
    assert sink.add_chunk("b", [7, 8, 9], b_aux[:1], b_last[:1]) is None
    assert sink.add_chunk("a", [1, 2, 3, 4, 5], a_aux[2:4], a_last[2:4]) is None
    meta_b = sink.add_chunk("b", [7, 8, 9], b_aux[1:], b_last[1:])
    meta_a = sink.add_chunk("a", [1, 2, 3, 4, 5], a_aux[4:], a_last[4:])
    sink.flush()
    assert meta_a == {"file": str(tmp_path / "a.safetensors"), "rows": 5, "dtype": "bfloat16",
                      "aux_shape": [5, 6], "last_shape": [5, 2], "engine": "sglang"}
    assert meta_b["rows"] == 3
    for sid, ids, aux, last in (("a", [1, 2, 3, 4, 5], a_aux, a_last), ("b", [7, 8, 9], b_aux, b_last)):
        with safe_open(str(tmp_path / f"{sid}.safetensors"), "pt") as f:
            got = {k: f.get_tensor(k) for k in ("input_ids", "aux", "last")}
            assert f.metadata()["sha256"] == tensor_sha256(got)
        assert got["input_ids"].tolist() == ids
        assert torch.equal(got["aux"], aux) and torch.equal(got["last"], last)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors"]


def test_rows_beyond_the_prompt_are_an_error_and_drop_forgets(tmp_path):
    sink = CaptureSink(tmp_path)
    with pytest.raises(RuntimeError, match="4 rows for a 3-token prompt"):
        sink.add_chunk("x", [1, 2, 3], torch.zeros(4, 2), torch.zeros(4, 1))
    sink.add_chunk("y", [1, 2, 3], torch.zeros(2, 2), torch.zeros(2, 1))
    sink.drop("y")  # retracted: its rows will be recomputed from the start
    assert sink.add_chunk("y", [1, 2, 3], torch.zeros(3, 2), torch.zeros(3, 1))["rows"] == 3
    sink.flush()


def test_writer_failure_surfaces_on_the_next_call(tmp_path):
    sink = CaptureSink(tmp_path / "d")
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("not a directory")
    sink.add_chunk("z", [1], torch.zeros(1, 2), torch.zeros(1, 1))
    with pytest.raises(RuntimeError, match="capture writer failed"):
        sink.flush()


def test_sha_depends_on_every_byte():
    t = {"a": torch.zeros(4, dtype=torch.bfloat16)}
    u = {"a": torch.zeros(4, dtype=torch.bfloat16)}
    u["a"][3] = 1
    assert tensor_sha256(t) != tensor_sha256(u)


def test_streamed_safetensors_read_back_by_safetensors_and_hash_the_file(tmp_path):
    import hashlib

    from safetensors.torch import load_file

    from eaglebox.shards.format import write_safetensors

    parts = {"aux": [torch.randn(3, 4).bfloat16(), torch.randn(2, 4).bfloat16()],
             "mask": [torch.tensor([1, 0, 1], dtype=torch.uint8)], "ids": [torch.arange(5), torch.arange(2)]}
    path = tmp_path / "x.safetensors"
    digest, size = write_safetensors(path, parts, {"k": "v"}, fsync=True)
    got = load_file(path)
    assert {k: torch.cat(v) for k, v in parts.items()}.keys() == got.keys()
    assert all(torch.equal(got[k], torch.cat(v)) for k, v in parts.items())
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"k": "v"}
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and size == path.stat().st_size
    assert tensor_sha256(parts) == tensor_sha256({k: torch.cat(v) for k, v in parts.items()})
    with pytest.raises(ValueError, match="'aux'"):  # mismatched parts: nothing written, no temp left
        write_safetensors(tmp_path / "y.safetensors", {"aux": [torch.zeros(2, 4), torch.zeros(2, 3)]}, {}, fsync=False)
    with pytest.raises(TypeError, match="meta"):  # fails with the temp open (a meta tensor has no bytes): the temp is removed
        write_safetensors(tmp_path / "z.safetensors", {"a": [torch.zeros(4)], "b": [torch.empty(2, device="meta")]}, {},
                          fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]
