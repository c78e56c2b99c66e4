"""Capture through the real SGLang 0.5.23 server on CPU, with the eaglebox hook active.

One capture server (chunked prefill of 64 tokens, so most samples span several chunks) serves the
in-process tests; the resume test runs ``eaglebox extract`` as users do, and kills it with -9.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from eaglebox.bench.parity import parity_report
from eaglebox.config import load_config
from eaglebox.engine.launch import server_for
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import feature_bound
from eaglebox.extract.run import capture, prepare
from eaglebox.shards.format import ShardReader, file_sha256
from eaglebox.shards.spec import capture_spec

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def capture_server(tiny_target, tiny_cfg_path, tmp_path_factory):
    from conftest import free_port

    staging = tmp_path_factory.mktemp("staging")
    cfg = load_config(tiny_cfg_path, [f"engine.port={free_port()}", "engine.chunked_prefill_size=64"])
    srv = server_for(cfg, "capture", staging.parent / "capture-server.log", capture_dir=staging,
                     layer_ids=list(capture_spec(cfg).layers.layer_ids))
    with srv:
        yield cfg, srv, staging


def extract(cfg, srv, staging, out, *overrides, log=lambda *_: None):
    from eaglebox.config import load_config as reload

    cfg = reload(TINY_CONFIG(), [f"engine.port={cfg.engine.port}", f"extract.output_dir={out}",
                                 "extract.regenerate=false", *overrides])
    spec = capture_spec(cfg)
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    plan = prepare(cfg.extract, spec, tok, log=log)
    return capture(cfg.extract, srv.url, spec, tok, plan, staging, bound=feature_bound(cfg.model.path),
                   alive=srv.alive, log=log), plan.planned


def TINY_CONFIG():
    from conftest import TINY_CONFIG

    return TINY_CONFIG


def test_concurrent_chunked_capture_matches_hf_layer_by_layer(capture_server, tmp_path):
    cfg, srv, staging = capture_server
    manifest, planned = extract(cfg, srv, staging, tmp_path / "c4", "extract.max_samples=16",
                                "extract.shard_size=6", "extract.concurrency=4")
    assert [s["file"] for s in manifest["shards"]] == [f"shard-0000{i}.safetensors" for i in range(3)]
    rows = [r["rows"] for s in manifest["shards"] for r in s["samples"]]
    assert rows == [len(p.input_ids) for p in planned]
    assert max(rows) > 64 * 2 and sum(r > 64 for r in rows) >= 4  # several samples span chunks, one three
    reader = ShardReader(tmp_path / "c4", verify=True)
    for i, p in enumerate(planned):
        assert reader.get(i)["input_ids"].tolist() == p.input_ids
        assert reader.get(i)["loss_mask"].tolist() == p.loss_mask
    report = parity_report(tmp_path / "c4", cfg.model.path, num_samples=16)
    assert report["ok"], report
    for layer in report["aux"]:
        others = [c for k, c in enumerate(layer["cos_by_reference_index"]) if k != layer["reference_index"]]
        assert layer["cos"] >= 0.9999 and layer["cos"] > max(others)
    assert report["last"]["cos"] >= 0.9999
    assert list(staging.iterdir()) == []  # staged samples are deleted once their shard is committed

    # the same samples one at a time: concurrency must not mix rows between requests
    single, _ = extract(cfg, srv, staging, tmp_path / "c1", "extract.max_samples=16", "extract.shard_size=6",
                        "extract.concurrency=1")
    one = ShardReader(tmp_path / "c1")
    for i in range(len(planned)):
        a, b = reader.get(i), one.get(i)
        cos = torch.nn.functional.cosine_similarity(a["aux"].float().flatten(), b["aux"].float().flatten(), dim=0)
        assert cos > 0.9999


def test_resume_accepts_the_same_layers_named_otherwise_and_refuses_another_spec(capture_server, tmp_path):
    cfg, srv, staging = capture_server
    first, _ = extract(cfg, srv, staging, tmp_path / "s", "extract.max_samples=2")
    # inputs of layers 1..3 are the outputs of layers 0..2: the same capture, so nothing is redone
    again, _ = extract(cfg, srv, staging, tmp_path / "s", "extract.max_samples=2", "capture.layer_ids=[1, 2, 3]",
                       "capture.convention=input_of_layer")
    assert again["shards"] == first["shards"]
    with pytest.raises(ExtractError, match=r"its shards were captured with .*bfloat16.*would capture with .*float32"):
        extract(cfg, srv, staging, tmp_path / "s", "extract.max_samples=2", "model.dtype=float32")


def run_cli(out: Path, port: int, *extra) -> subprocess.Popen:
    from conftest import ROOT, TINY_CONFIG

    return subprocess.Popen([sys.executable, "-m", "eaglebox.cli", "extract", "--config", str(TINY_CONFIG),
                             f"extract.output_dir={out}", f"engine.port={port}", "extract.max_samples=40",
                             "extract.regenerate=false",
                             "extract.shard_size=4", "extract.concurrency=1", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kill_9_then_rerun_gives_byte_identical_shards(tiny_target, tmp_path):
    from conftest import free_port

    port = free_port()
    ref = run_cli(tmp_path / "ref", port)
    assert ref.wait(timeout=600) == 0, ref.stdout.read()[-3000:]

    victim = run_cli(tmp_path / "cut", port)
    manifest = tmp_path / "cut" / "manifest.json"
    deadline = time.monotonic() + 300
    while not (manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 2):
        assert victim.poll() is None and time.monotonic() < deadline, victim.stdout.read()[-3000:]
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    cut = json.loads(manifest.read_text())
    assert len(cut["shards"]) < 10  # really interrupted
    visible = sorted(p.name for p in (tmp_path / "cut").glob("shard-*.safetensors"))
    # the manifest lists a prefix of the committed shards: it is rewritten once an eighth more is committed
    assert visible[: len(cut["shards"])] == [s["file"] for s in cut["shards"]]

    resumed = run_cli(tmp_path / "cut", port)
    out = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, out[-3000:]

    def files(d):
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and ".staging" not in p.parts)
    ref_files = files(tmp_path / "ref")
    assert ref_files == files(tmp_path / "cut")
    assert sum(name.count("/") for name in ref_files) == 40  # every sample file, in its shard's folder
    for name in ref_files:
        if name.startswith("shard-"):
            assert file_sha256(tmp_path / "ref" / name) == file_sha256(tmp_path / "cut" / name), name
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("ref", "cut"))
    assert a["shards"] == b["shards"] and len(a["shards"]) == 10


def test_bad_row_fails_before_anything_is_written(tiny_target, tmp_path):
    from conftest import free_port

    data = tmp_path / "bad.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    data.write_text(good + "\n" + '{"messages": [}\n')
    p = run_cli(tmp_path / "out", free_port(), f"extract.dataset={data}", "extract.on_bad_row=error")
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 1
    assert f"{data}: line 2: not valid JSON" in out
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out-server.log"))


def test_two_concurrent_requests_for_one_sample_each_span_several_chunks(capture_server):
    """A retried or duplicated request (same sample, another nonce) in the middle of a chunked prefill:
    the server keeps each request's rows apart (keyed by sample id they merged, and the scheduler died
    on 'rows beyond the prompt'), answers both, and writes one complete file."""
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from safetensors import safe_open

    from eaglebox.shards.format import tensor_sha256
    from eaglebox.shards.requests import capture_rid

    cfg, srv, staging = capture_server
    ids = torch.randint(10, 200, (300,), generator=torch.Generator().manual_seed(3)).tolist()  # 5 chunks of 64

    def send(nonce):
        body = {"input_ids": ids, "rid": capture_rid("dup0", nonce), "return_hidden_states": True,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        return requests.post(srv.url + "/generate", json=body, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(send, ["first", "retry"]))
    assert [a.status_code for a in answers] == [200, 200] and srv.alive()
    assert [a.json()["meta_info"]["hidden_states"][0]["rows"] for a in answers] == [300, 300]
    # both writes were queued before either answer was sent; each renames over the other, so wait until the
    # folder has held only the file for a second (CI once read it while the second write's temp was open)
    path = staging / "dup0.safetensors"
    deadline, settled = time.monotonic() + 60, None
    while time.monotonic() < deadline and (settled is None or time.monotonic() - settled < 1.0):
        alone = sorted(p.name for p in staging.iterdir()) == [path.name]
        settled = (settled or time.monotonic()) if alone else None
        time.sleep(0.02)
    with safe_open(str(path), "pt") as f:
        got = {k: f.get_tensor(k) for k in ("input_ids", "aux", "last")}
        assert f.metadata()["sha256"] == tensor_sha256(got)
    assert got["input_ids"].tolist() == ids and got["aux"].shape[0] == got["last"].shape[0] == 300
    path.unlink()
    assert sorted(p.name for p in staging.iterdir()) == []


def test_a_mooncake_request_to_a_server_without_mooncake_settings_is_refused_and_the_server_lives(capture_server):
    """A trainer with train.online.transport: mooncake against a server at train.online.url launched
    without the store's settings: its request is answered with the reason, nothing is captured, and the
    server (which may be shared) goes on capturing; before, its writer failed and stopped the server."""
    from eaglebox.extract.http import Client, capture_one
    from eaglebox.extract.plan import Planned

    cfg, srv, staging = capture_server
    ids = list(range(10, 90))
    client = Client(srv.url, 0, 0.1)
    with pytest.raises(ExtractError, match=r"sample at line 7: the capture server refused it: mooncake:run/s1: "
                                           r"this capture server was launched without Mooncake settings"):
        capture_one(client, Planned("s1", 7, ids, [1] * len(ids)), "mooncake:run/s1")
    capture_one(client, Planned("s2", 8, ids, [1] * len(ids)))
    assert srv.alive()
    deadline = time.monotonic() + 60
    while not (staging / "s2.safetensors").exists():
        assert time.monotonic() < deadline, sorted(p.name for p in staging.iterdir())
        time.sleep(0.05)
    assert not [p for p in staging.rglob("*") if "s1" in p.name]  # the refused sample: nothing anywhere
    (staging / "s2.safetensors").unlink()


def malformed_corpus(path: Path) -> Path:
    """Two good rows around what real corpora hold: a BOM, a bad UTF-8 byte, OpenAI content parts, an
    image part, a line over the byte cap."""
    def conv(user, answer="fine"):
        return json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
    lines = [b"\xef\xbb\xbf" + conv("hello there").encode(), b'{"text": "caf\xe9"}',
             json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "how are you"}]},
                                      {"role": "assistant", "content": "good"}]}).encode(),
             json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                                      {"role": "assistant", "content": "a cat"}]}).encode(),
             conv("x" * 50_000).encode(), conv("what is up").encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_malformed_corpus_is_skipped_row_by_row_or_refused_in_one_error(capture_server, tmp_path):
    """Refused: the CLI, before any server starts. Skipped: the same rows through the module's capture
    server (the client code the CLI runs; a server of its own cost a start and proved nothing more)."""
    from conftest import free_port

    data = malformed_corpus(tmp_path / "corpus.jsonl")
    refused = run_cli(tmp_path / "refused", free_port(), f"extract.dataset={data}", "extract.on_bad_row=error")
    out = refused.communicate(timeout=300)[0]
    assert refused.returncode == 1 and "Traceback" not in out
    assert f"{data}: line 2: not valid UTF-8 (byte" in out and "extract.on_bad_row=skip" in out
    assert not (tmp_path / "refused").exists()

    cfg, srv, staging = capture_server
    lines = []
    extract(cfg, srv, staging, tmp_path / "skipped", f"extract.dataset={data}", "extract.on_bad_row=skip",
            log=lambda *a: lines.append(" ".join(map(str, a))))
    out = "\n".join(lines)
    for reason in ("line 2: not valid UTF-8", "line 4: messages[0].content[0]: a 'image_url' part",
                   "over extract.max_row_bytes=49,152"):
        assert reason in out, reason
    assert "skipped 3 malformed rows" in out
    manifest = json.loads((tmp_path / "skipped" / "manifest.json").read_text())
    assert sorted(s["line"] for shard in manifest["shards"] for s in shard["samples"]) == [1, 3, 6]


def test_regenerate_run_on_a_too_small_disk_is_refused_before_the_server_starts(tiny_target, tmp_path):
    """Regeneration runs through the server for minutes to hours: the disk estimate (answers counted at
    regenerate_max_new_tokens) is checked first, and the refusal leaves nothing behind."""
    from conftest import free_port

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        p = run_cli(small / "out", free_port(), "extract.regenerate=true")
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 1 and "Traceback" not in out, out[-3000:]
        assert f"not enough disk at {small}" in out
        assert "starting SGLang" not in out and list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)])


def test_a_disk_that_fills_during_capture_is_named_in_one_line(tiny_target, tmp_path):
    """The disk estimate passed, then something else took the space: the run stops with one line naming
    the cause (not "the server has exited"), and the shards it committed before read back verified."""
    from conftest import free_port

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        p = run_cli(small / "out", free_port())
        lines = []
        for line in p.stdout:  # once the server is up, another writer fills the disk
            lines.append(line)
            if "server healthy" in line:
                subprocess.run(["dd", "if=/dev/zero", f"of={small / 'filler'}", "bs=1M"], capture_output=True)
                break
        out = "".join(lines) + p.communicate(timeout=600)[0]
        assert p.returncode == 1 and "Traceback" not in out, out[-3000:]
        errors = re.findall(r"eaglebox extract: [^\r\n]*", out)  # after the progress bar's \r
        assert len(errors) == 1 and "No space left on device" in errors[0], out[-3000:]
        manifest = small / "out" / "manifest.json"
        if manifest.exists():  # what was committed is whole
            committed = json.loads(manifest.read_text())
            reader = ShardReader(small / "out", verify=True)
            assert len(reader) == sum(len(s["samples"]) for s in committed["shards"])
            for i in range(len(reader)):
                reader.get(i)
    finally:
        subprocess.run(["umount", str(small)])
