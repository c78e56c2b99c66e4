"""Online training over the Mooncake store (issue 31 items 2 and 3, on loopback): a real ``mooncake_master``,
a real SGLang capture server on the CPU putting each sample into the store, the trainer getting it by key,
verifying it as the file path does and removing the key. The server, the samples, the run and the offline
reference are ``test_online.py``'s (``url_server``, launched with Mooncake settings, and ``offline_curve``:
shared, so this adds no server start). The refusals that need no server are ``tests/unit/test_transport.py``."""

import json
import subprocess

import pytest
from test_online import SAMPLES, extract_dir, losses, train_cmd

from conftest import ROOT

pytestmark = pytest.mark.sglang


def test_online_over_mooncake_trains_the_offline_curve_and_leaves_nothing_in_the_store(
        tiny_shards, offline_curve, url_server, mooncake_master, tmp_path):
    _, want = offline_curve
    url, spool, _ = url_server
    before = sorted(spool.rglob("*"))
    out = tmp_path / "online"
    r = subprocess.run(train_cmd(out, f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}", *SAMPLES,
                                 "train.data=online", f"train.online.url={url}", "train.online.transport=mooncake",
                                 f"train.online.mooncake.master={mooncake_master}",
                                 "train.online.mooncake.segment_bytes=16777216",
                                 "train.online.mooncake.key_prefix=test-online"),
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    said = r.stdout + r.stderr
    assert r.returncode == 0, said[-3000:]
    assert f"through the Mooncake store at {mooncake_master}" in said, said[-3000:]
    assert losses(out) == want  # exactly: the same bytes, verified the same way, in the same order
    report = json.loads((out / "report.json").read_text())["data"]
    print(json.dumps(report))
    assert report["transport"] == "mooncake" and report["captured"] == 24 * 8, report
    assert list((out / "spool").iterdir()) == []  # the trainer's local copies deleted once read

    # the server stored the samples in the store, not as files in its capture directory; no key is left behind
    assert sorted(spool.rglob("*")) == before
    from eaglebox.config.schema import MooncakeConfig
    from eaglebox.shards.transport import MooncakeTransport

    store = MooncakeTransport(MooncakeConfig(master=mooncake_master, segment_bytes=16 << 20).model_dump(),
                              mount=False).store
    try:
        assert store.remove_by_regex("^test-online/", True) == 0
    finally:
        store.close()
