"""Damaged feature files are never trained on: training verifies every sample as its loader threads read
it and stops at the first damaged one, naming it and the command that repairs it; that command
(``eaglebox extract`` over the same folder) re-verifies the committed samples, sets damaged ones aside
and captures them again; parity verifies every sample; a manifest that disagrees with the shard
indexes it names is refused. Shards are written by the real capture sink and committed by the real
client; the trainer is the real one on the tiny target's shapes. The extract test's server is a
stand-in for SGLang (no SGLang server in unit tests) that hands each request to the real capture sink,
as the capture hook does."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from conftest import config_for_model, eaglebox_cli, small_spec
from eaglebox.capture.sink import CaptureSink
from eaglebox.extract.commit import commit_shard, feature_bound
from eaglebox.extract.plan import Planned
from eaglebox.extract.run import run_extract
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.format import DAMAGED, FORMAT, ShardError, ShardReader, save_manifest
from eaglebox.shards.requests import sample_id_from_rid
from eaglebox.train.data import prefetch

REPAIR = r"run `eaglebox extract` again with the config that wrote .*: it re-verifies every committed sample"


def features(sid: str, rows: int, width: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same features for a sample id every time it is captured (so a recapture is checkable)."""
    g = torch.Generator().manual_seed(int(sid, 16) % 2**31)
    return torch.randn(rows, width, generator=g).bfloat16(), torch.randn(rows, hidden, generator=g).bfloat16()


def write_shards(out, staging, spec: CaptureSpec, samples: list[list[int]], shard_size: int) -> list[Planned]:
    """Capture ``samples`` through the real sink and commit them as the client does."""
    H, k = spec.hidden_size, len(spec.layers.layer_ids)
    sink = CaptureSink(staging, header=spec.sample_header())
    planned = [Planned(f"{i:032x}", i + 1, ids, [0] + [1] * (len(ids) - 1)) for i, ids in enumerate(samples)]
    for p in planned:
        sink.add_chunk(f"eaglebox-{p.id}-0", p.id, p.input_ids, *features(p.id, len(p.input_ids), k * H, H))
    sink.flush()
    out.mkdir(parents=True, exist_ok=True)
    entries = [commit_shard(out, i, planned[a : a + shard_size], staging, spec)
               for i, a in enumerate(range(0, len(planned), shard_size))]
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": entries})
    return planned


def flip_feature_byte(path, at: int = -1) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


SPEC = small_spec()


def small_shards(tmp_path, n: int = 6):
    out = tmp_path / "shards"
    planned = write_shards(out, tmp_path / "staging", SPEC, [[5 + i, 6, 7, 8 + i] for i in range(n)], 2)
    return out, planned


def test_the_loader_runs_in_its_threads_in_order_and_raises_at_the_failing_items_turn():
    names = list(prefetch(lambda i: (i, threading.current_thread().name), range(9), 2))
    assert [r for _, (r, _) in names] == list(range(9))
    assert all(name.startswith("eaglebox-loader") for _, (_, name) in names)

    def fail_at_5(i):
        if i == 5:
            raise ShardError("five")
        return i

    got = []
    with pytest.raises(ShardError, match="five"):
        for i, _ in prefetch(fail_at_5, range(20), 2):
            got.append(i)
    assert got == [0, 1, 2, 3, 4]


def test_training_stops_at_the_first_damaged_sample_naming_it_and_the_repair(tiny_target, tmp_path):
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.loop import run_train

    cfg = config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]", f"extract.output_dir={tmp_path / 'shards'}",
                           f"train.output_dir={tmp_path / 'train'}", "train.draft.draft_vocab_size=64",
                           "train.batch_size=2", "train.max_length=16", "train.ttt_length=2", "train.dtype=float32",
                           "train.log_every=1", "train.checkpoint_every=100")
    spec = capture_spec(cfg)
    g = torch.Generator().manual_seed(0)
    write_shards(tmp_path / "shards", tmp_path / "staging", spec,
                 [torch.randint(3, 2048, (12,), generator=g).tolist() for _ in range(8)], 4)
    damaged = tmp_path / "shards" / "shard-00001" / f"{6:032x}.safetensors"
    flip_feature_byte(damaged)
    with pytest.raises(ShardError, match=f"{damaged}: its tensors' sha256 differs from manifest.json: the file "
                                         f"changed after capture; {REPAIR}"):
        run_train(cfg, spec, log=lambda *_: None)
    assert not (tmp_path / "train" / "draft").exists()
    damaged.write_bytes(damaged.read_bytes()[:-3])  # cut short: the same advice
    with pytest.raises(ShardError, match=f"{damaged}: not a complete sample file .*; {REPAIR}"):
        run_train(cfg, spec, log=lambda *_: None)


def test_an_error_raised_under_a_progress_bar_ends_the_bar_and_stands_on_its_own_last_line(tiny_target, tmp_path):
    from eaglebox.shards.spec import capture_spec

    overrides = ["capture.layer_ids=[0, 1, 2]", f"extract.output_dir={tmp_path / 'shards'}",
                 f"train.output_dir={tmp_path / 'train'}", "train.draft.draft_vocab_size=64", "train.batch_size=2",
                 "train.max_length=16", "train.ttt_length=2", "train.dtype=float32", "train.log_every=1"]
    cfg = config_for_model(tmp_path, tiny_target, *overrides)
    g = torch.Generator().manual_seed(0)
    write_shards(tmp_path / "shards", tmp_path / "staging", capture_spec(cfg),
                 [torch.randint(3, 2048, (12,), generator=g).tolist() for _ in range(8)], 4)
    damaged = tmp_path / "shards" / "shard-00001" / f"{6:032x}.safetensors"
    flip_feature_byte(damaged)
    r = eaglebox_cli("train", "--config", str(tmp_path / "c.yaml"), *overrides, timeout=300)
    assert r.returncode == 1 and "train:" in r.stderr, r.stderr  # the bar was drawn
    *before, last = r.stderr.split("\n")[:-1]
    assert last.startswith(f"eaglebox train: {damaged}: its tensors' sha256 differs"), r.stderr[-2000:]
    assert "\r" not in last and before, r.stderr[-2000:]  # on its own line, the bar's ended before it


def test_parity_verifies_every_sample_not_only_those_it_compares(tmp_path):
    from eaglebox.bench.parity import parity_report

    out, _ = small_shards(tmp_path)
    flip_feature_byte(out / "shard-00002" / f"{5:032x}.safetensors")  # the last sample; parity compares 1
    with pytest.raises(ShardError, match=f"{5:032x}.safetensors: its tensors' sha256 differs"):
        parity_report(out, tmp_path / "no-model", num_samples=1)


def test_a_manifest_edited_to_claim_other_layers_is_refused(tmp_path):
    out, _ = small_shards(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["capture"] |= {"layer_ids": [1, 2, 3], "captured_layer_inputs": [2, 3, 4]}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"shard-00000.safetensors: records the capture captured_layer_inputs=\[1, 2, "
                                         r"3\], layer_ids=\[0, 1, 2\]; manifest.json claims captured_layer_inputs="
                                         r"\[2, 3, 4\], layer_ids=\[1, 2, 3\]: the manifest was edited"):
        ShardReader(out)
    manifest["capture"] = SPEC.as_json()
    manifest["shards"][0]["samples"].reverse()  # the samples' order (offsets) no longer the index's
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="shard-00000.safetensors: its sample ids or offsets differ"):
        ShardReader(out)


def test_a_sample_whose_own_header_disagrees_with_the_manifest_is_refused(tmp_path):
    out, _ = small_shards(tmp_path, 2)
    path = out / "shard-00000" / f"{1:032x}.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"[1, 2, 3]", b"[1, 2, 4]"))  # the sample's header, same length
    with pytest.raises(ShardError, match=r"the capture server recorded captured_layer_inputs=\[1, 2, 4\], "
                                         r"manifest.json says captured_layer_inputs=\[1, 2, 3\]"):
        ShardReader(out).get(1)


class CaptureStandIn:
    """An HTTP server answering ``/generate`` capture requests as the patched SGLang does: the rows
    go to the real :class:`CaptureSink`, the answer carries its metadata."""

    def __init__(self, staging, spec):
        self.sink = CaptureSink(staging, header=spec.sample_header())
        self.captured: list[str] = []
        H, k = spec.hidden_size, len(spec.layers.layer_ids)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sid, ids = sample_id_from_rid(body["rid"]), body["input_ids"]
                stand_in.captured.append(sid)
                meta = stand_in.sink.add_chunk(body["rid"], sid, ids, *features(sid, len(ids), k * H, H))
                stand_in.sink.flush()
                data = json.dumps({"meta_info": {"prompt_tokens": len(ids), "hidden_states": [meta]}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}"


def test_rerunning_extract_sets_damaged_samples_aside_and_captures_them_again(tiny_target, tmp_path):
    out, staging = tmp_path / "shards", tmp_path / "shards" / ".staging"
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("{}\n")
    cfg = config_for_model(tmp_path, tiny_target, f"extract.output_dir={out}", f"extract.dataset={dataset}",
                           "extract.shard_size=2", "extract.max_retries=0")
    bound = feature_bound(tiny_target)
    planned = [Planned(f"{i:032x}", i + 1, [5 + i, 6, 7, 8 + i], [0, 1, 1, 1]) for i in range(6)]
    server = CaptureStandIn(staging, SPEC)
    try:
        log = []
        first = run_extract(cfg.extract, server.url, SPEC, planned, None, staging, bound=bound, log=log.append)
        assert sorted(server.captured) == [p.id for p in planned]
        good = {s["file"]: (out / s["file"]).read_bytes() for sh in first["shards"] for s in sh["samples"]}
        flipped, cut = out / "shard-00000" / f"{1:032x}.safetensors", out / "shard-00002" / f"{4:032x}.safetensors"
        flip_feature_byte(flipped)
        cut.write_bytes(cut.read_bytes()[:100])
        index = out / "shard-00001.safetensors"
        good_index = index.read_bytes()
        index.write_bytes(good_index[:-5])
        with pytest.raises(ShardError, match=f"{index}: sha256 differs from manifest.json.*; {REPAIR}"):
            ShardReader(out)
        index.write_bytes(good_index)
        with pytest.raises(ShardError, match=f"{flipped}: its tensors' sha256 differs from manifest.json.*; {REPAIR}"):
            ShardReader(out, verify=True)
        index.write_bytes(good_index[:-5])

        server.captured.clear()
        log.clear()
        again = run_extract(cfg.extract, server.url, SPEC, planned, json.loads((out / "manifest.json").read_text()), staging,
                            bound=bound, log=log.append)
        assert sorted(server.captured) == [f"{1:032x}", f"{4:032x}"]  # only the damaged ones, captured again
        assert any(f"{flipped}: its tensors' sha256 differs" in line and f"moved to {out / DAMAGED}" in line
                   for line in log), log
        assert any(f"{cut}: not a complete sample file" in line for line in log), log
        assert any(f"{index}: sha256 differs" in line and "shard-00001.safetensors will be committed again" in line
                   for line in log), log
        assert not any("eaglebox extract` again" in line for line in log), log  # the rerun is that repair
        assert index.read_bytes() == good_index  # rewritten from its intact samples, none captured again
        assert (out / DAMAGED / "shard-00000" / flipped.name).exists()
        reader = ShardReader(out, verify=True)  # repaired: every sample verifies, byte for byte the first capture's
        assert len(reader) == 6 and again["samples"] == 6
        assert {s["file"]: (out / s["file"]).read_bytes() for sh in again["shards"] for s in sh["samples"]} == good
    finally:
        server.http.shutdown()
