"""The sample transports (``train.online.transport``, :mod:`eaglebox.shards.transport`) without SGLang: the
config's and the run's refusals of a Mooncake set-up that cannot work, each before a server starts and in
one error naming the key, and one sample's bytes through a real ``mooncake_master`` on loopback. Online
training over Mooncake against a real SGLang server is ``tests/integration/test_online_mooncake.py``."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from conftest import config_for_model, free_port
from eaglebox.errors import EagleboxError
from eaglebox.shards.transport import FileTransport, MooncakeTransport, TransportError

BASE = ["capture.layer_ids=[0, 1, 2]", "engine.device=cpu", "engine.max_total_tokens=1024", "train.data=online",
        "train.online.transport=mooncake"]


def settings(master: str, **changes) -> dict:
    from eaglebox.config.schema import MooncakeConfig

    return MooncakeConfig(master=master, segment_bytes=16 << 20, **changes).model_dump()


def refused(cfg, match: str) -> float:
    """``online_samples`` of ``cfg`` raises ``match`` before it writes anything; the seconds it took."""
    from eaglebox.extract.online import online_samples
    from eaglebox.shards.spec import capture_spec

    t0 = time.monotonic()
    with pytest.raises(EagleboxError, match=match):
        with online_samples(cfg, capture_spec(cfg)):
            pass
    return time.monotonic() - t0


@pytest.mark.parametrize(("override", "error"), [
    ("train.online.mooncake.master=localhost", r"train.online.mooncake.master: .*'localhost' is not host:port"),
    ("train.online.mooncake.metadata_server=etcd://x:2379",
     r"train.online.mooncake.metadata_server: .*P2PHANDSHAKE or an HTTP metadata server's URL"),
    ("train.online.mooncake.segment_bytes=1000000", r"train.online.mooncake.segment_bytes: .*greater than or equal to "
                                                    "16777216"),
    ("train.online.transport=rdma", r"train.online.transport: .*'file' or 'mooncake'"),
])
def test_the_config_refuses_what_mooncake_cannot_use_naming_the_key(tiny_target, tmp_path, override, error):
    from eaglebox.config.load import ConfigError

    with pytest.raises(ConfigError, match=error):
        config_for_model(tmp_path, tiny_target, *BASE, override)


def test_a_segment_that_cannot_hold_the_samples_in_flight_is_refused_before_anything_connects(tiny_target, tmp_path):
    # 5 samples of 4096 tokens of the tiny target are 21.5 MB: over 90% of a 16 MiB segment. No master runs
    # at the address, and connect_timeout_s is long: the refusal comes first, at once.
    cfg = config_for_model(tmp_path, tiny_target, *BASE, f"extract.dataset={tmp_path / 'none.jsonl'}",
                           f"train.output_dir={tmp_path / 'train'}", "extract.max_length=4096",
                           f"train.online.mooncake.master=127.0.0.1:{free_port()}",
                           "train.online.mooncake.segment_bytes=16777216", "train.online.mooncake.connect_timeout_s=300")
    took = refused(cfg, r"^train.online.mooncake.segment_bytes=16,777,216 cannot hold the samples in flight: 5 .* of "
                        r"up to 4096 tokens \(extract.max_length\) are 21,483,520 bytes, over the 90% of the segment "
                        r"the master fills before it evicts; set it to at least 23,870,578$")
    assert took < 10 and not (tmp_path / "train").exists()


def test_no_master_at_the_address_is_refused_within_the_timeout_naming_the_key(tiny_target, tmp_path):
    master = f"127.0.0.1:{free_port()}"
    cfg = config_for_model(tmp_path, tiny_target, *BASE, f"extract.dataset={tmp_path / 'none.jsonl'}",
                           f"train.output_dir={tmp_path / 'train'}", f"train.online.mooncake.master={master}",
                           "train.online.mooncake.connect_timeout_s=2")
    took = refused(cfg, rf"^train.online.mooncake.master={master}: no Mooncake master answers there within 2 s "
                        r"\(.*\); start one \(mooncake_master --rpc_port=\d+\) or set the key to its host:port$")
    assert took < 10 and not (tmp_path / "train").exists()  # Mooncake's own setup retries for 90 s


def test_a_missing_mooncake_package_is_refused_saying_what_to_install(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # import mooncake.store raises ImportError
    cfg = config_for_model(tmp_path, tiny_target, *BASE, f"extract.dataset={tmp_path / 'none.jsonl'}",
                           f"train.output_dir={tmp_path / 'train'}")
    refused(cfg, r"^train.online.transport: mooncake needs the Python package mooncake-transfer-engine-non-cuda "
                 r"\(pip install 'mooncake-transfer-engine-non-cuda==0\.3\.13\.post1', or `make venv`\), and the "
                 r"system package libibverbs1")
    assert not (tmp_path / "train").exists()


def blobs_of(n: int) -> tuple[list, bytes]:
    head, body = b"header--", torch.arange(n, dtype=torch.int64)
    blobs = [head, memoryview(body.numpy()).cast("B")]
    return blobs, head + body.numpy().tobytes()


def test_one_sample_through_each_transport_arrives_as_the_same_bytes_and_is_freed(mooncake_master, tmp_path):
    blobs, whole = blobs_of(300_000)  # 2.4 MB
    files = FileTransport(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    files.put(files.request_name("s1"), blobs)
    files.fetch("s1", tmp_path / "spool" / "s1.safetensors")
    assert (tmp_path / "spool" / "s1.safetensors").read_bytes() == whole

    server = MooncakeTransport(settings(mooncake_master), mount=True)
    trainer = MooncakeTransport(settings(mooncake_master, key_prefix="t1"), mount=False)
    try:
        name = trainer.request_name("rank1/s1")
        assert name == "mooncake:t1/rank1/s1"
        server.put(name, blobs_of(10)[0])
        server.put(name, blobs)  # a sample captured again replaces the bytes there
        trainer.fetch(name, tmp_path / "got")
        assert (tmp_path / "got").read_bytes() == whole
        assert trainer.store.is_exist(name) == 0  # freed
        with pytest.raises(TransportError, match=r"^Mooncake key t1/rank1/s2: not there within 0 s of its answer$"):
            trainer.fetch("mooncake:t1/rank1/s2", tmp_path / "none", wait_s=0.2)
        # what a killed run left under its prefix is removed at the next start; another prefix's keys stay
        server.put("t1/rank1/s3", blobs)
        server.put("t2/s3", blobs)
        trainer.clean("rank1/")
        assert trainer.store.is_exist("t1/rank1/s3") == 0 and trainer.store.is_exist("t2/s3") == 1
        trainer.store.remove("t2/s3", True)
        # a sample larger than the segment and transfer buffer is refused, not waited for
        big, _ = blobs_of(3_000_000)  # 24 MB
        with pytest.raises(TransportError, match=r"^Mooncake put of t1/s4 \(24,000,008 bytes\) failed with code -\d+$"):
            server.put("t1/s4", big, wait_s=1)
    finally:
        trainer.close()
        server.close()
