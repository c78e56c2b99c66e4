"""The target's weight fingerprint sees every byte: a one-byte change anywhere in a safetensors file (its
header, a chunk boundary, the middle, the last byte) changes it, where the old fingerprint read 32
sampled 64 KiB blocks a file. A file's digest is cached by path, size, mtime, inode and ctime; a draft or
shards fingerprinted the old way get one clear message, not a crash."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from safetensors.torch import save_file

from eaglebox.errors import EagleboxError
from eaglebox.target import fingerprint
from eaglebox.target.fingerprint import ALGORITHM, CHUNK_BYTES, cache_path, file_digests, target_fingerprint


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def model(d, numel: int):
    d.mkdir()
    (d / "config.json").write_text("{}")
    save_file({"model.layers.0.input_layernorm.weight": torch.ones(numel, dtype=torch.bfloat16)},
              d / "model.safetensors")
    return d


def flip(path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


def test_a_one_byte_change_anywhere_in_a_file_is_caught(tmp_path):
    d = model(tmp_path / "m", (5 * CHUNK_BYTES // 2) // 2)  # 2.5 chunks of bf16 ones
    f = d / "model.safetensors"
    size = f.stat().st_size
    first = target_fingerprint(d)
    assert first["weights_algorithm"] == ALGORITHM
    for at in (8, CHUNK_BYTES - 1, CHUNK_BYTES, 3 * CHUNK_BYTES // 2 + 12345, 2 * CHUNK_BYTES + 1, size - 1):
        flip(f, at)
        assert target_fingerprint(d)["weights_digest"] != first["weights_digest"], at
        flip(f, at)
        assert target_fingerprint(d) == first, at


def test_digests_are_cached_by_identity_and_recent_files_are_not(tmp_path):
    d = model(tmp_path / "m", 1000)
    f = d / "model.safetensors"
    fresh = file_digests([f])[f]
    assert not cache_path().exists() or str(f.resolve()) not in json.loads(cache_path().read_text())  # racy: not cached
    old = time.time_ns() - 3600 * 10**9
    os.utime(f, ns=(old, old))
    time.sleep(fingerprint.RACY_S + 0.1)  # the ctime utime just moved is now old enough to trust
    assert file_digests([f])[f] == fresh
    st = f.stat()
    entry = json.loads(cache_path().read_text())[str(f.resolve())]
    assert entry == {"size": st.st_size, "mtime_ns": old, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
                     "algorithm": ALGORITHM, "digest": fresh}
    cache_path().write_text(json.dumps({str(f.resolve()): entry | {"digest": "cached"}}))
    assert file_digests([f])[f] == "cached"  # a hit reads no byte


def test_a_same_size_file_with_its_mtime_set_back_is_hashed_again(tmp_path):
    """In place or swapped in (``cp -p``, ``rsync -t``, ``touch -r``): the ctime or the inode moves."""
    d = model(tmp_path / "m", 1000)
    f = d / "model.safetensors"
    old = time.time_ns() - 3600 * 10**9
    os.utime(f, ns=(old, old))
    time.sleep(fingerprint.RACY_S + 0.1)
    fresh, size = file_digests([f])[f], f.stat().st_size
    assert str(f.resolve()) in json.loads(cache_path().read_text())
    flip(f, f.stat().st_size - 1)
    os.utime(f, ns=(old, old))
    changed = file_digests([f])[f]
    assert changed != fresh
    flip(f, f.stat().st_size - 1)
    os.utime(f, ns=(old, old))
    time.sleep(fingerprint.RACY_S + 0.1)
    assert file_digests([f])[f] == fresh  # cached again under its new ctime
    other = tmp_path / "other.safetensors"
    other.write_bytes(f.read_bytes())
    flip(other, other.stat().st_size - 1)
    os.utime(other, ns=(old, old))
    os.replace(other, f)
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (size, old) and file_digests([f])[f] == changed


def test_an_old_fingerprint_in_a_draft_or_shards_gets_one_clear_message(tmp_path):
    from conftest import small_spec
    from eaglebox.serve.provenance import differences
    from eaglebox.shards.contract import CaptureSpec
    from eaglebox.train.loop import check_header

    d = model(tmp_path / "m", 1000)
    spec = small_spec(target=target_fingerprint(d))
    old = {**spec.provenance(), "target": {"config_sha256": spec.target.config_sha256, "weights_sha256": "ab" * 32,
                                           "tokenizer_sha256": spec.target.tokenizer_sha256}}
    assert differences(old, spec, []) == [
        "target fingerprint: the draft's was made by an older eaglebox (32 sampled 64 KiB blocks a file "
        f"(weights_sha256)); this eaglebox hashes every byte ({ALGORITHM}): they cannot be compared"]
    with pytest.raises(EagleboxError, match=r"the shards' target fingerprint was made by an older eaglebox .*; extract "
                                            r"them again"):
        check_header(CaptureSpec.load({**spec.as_json(), **old}, tmp_path), spec, tmp_path)
    assert differences(spec.provenance(), spec, []) == []


def test_one_process_at_a_time_reads_hashes_and_writes_the_cache(tmp_path):
    """torchrun's ranks all fingerprint the target: the first hashes, the others wait and read its digests."""
    import fcntl
    import threading

    d = model(tmp_path / "m", 1000)
    cache_path().parent.mkdir(parents=True)
    fd = os.open(cache_path().with_suffix(".lock"), os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another rank hashing
    waiting = threading.Thread(target=file_digests, args=([d / "model.safetensors"],))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()
    os.close(fd)
    waiting.join(10)
    assert not waiting.is_alive()
