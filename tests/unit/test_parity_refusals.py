"""``eaglebox parity`` on real shards of the tiny target: features from its own HF forward, written by
the capture sink and committed by the client as extraction does (no SGLang server: CPU is scarce).
Shards that claim a layer the reference model does not have, or a feature file changed on disk, are
refused with a message naming the file and the fix; matching shards pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import TINY, TINY_CONFIG, eaglebox_cli
from eaglebox.bench.parity import parity_report
from eaglebox.capture.sink import CaptureSink
from eaglebox.config import load_config
from eaglebox.errors import EagleboxError
from eaglebox.extract.commit import commit_shard
from eaglebox.extract.plan import Planned
from eaglebox.shards.format import FORMAT, ShardError, save_manifest
from eaglebox.shards.spec import capture_spec


def deeper_target(tiny_target: Path, out: Path) -> Path:
    """The tiny target with two more decoder layers (copies of layers 2 and 3): a 6-layer model whose
    features no 4-layer reference can reproduce."""
    shutil.copytree(tiny_target, out)
    weights = load_file(out / "model.safetensors")
    for new, old in ((4, 2), (5, 3)):
        for k in [k for k in weights if k.startswith(f"model.layers.{old}.")]:
            weights[k.replace(f"layers.{old}.", f"layers.{new}.")] = weights[k].clone()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 6}, indent=2))
    return out


def capture(target: Path, layer_ids: list[int], out: Path, num_samples: int = 4) -> Path:
    """Shards of ``target`` at ``layer_ids`` (outputs of layers), as extraction commits them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(TINY_CONFIG, [f"model.path={target}", f"capture.layer_ids={layer_ids}"])
    spec = capture_spec(cfg)
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in (TINY / "data" / "heldout.jsonl").read_text().splitlines()[:num_samples]]
    staging = out.parent / f"{out.name}-staging"
    sink = CaptureSink(staging, header=spec.sample_header())
    planned = []
    with torch.no_grad():
        for line, row in enumerate(rows, 1):
            ids = tok.apply_chat_template(row["messages"], tokenize=True, return_dict=False)[:96]
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            aux = torch.cat([hs[i][0] for i in spec.layers.captured_layer_inputs], -1).bfloat16()
            sink.add_chunk(f"rid-{line}", row["id"], ids, aux, hs[-1][0].bfloat16())
            planned.append(Planned(row["id"], line, ids, [0] + [1] * (len(ids) - 1)))
    sink.flush()
    out.mkdir()
    entry = commit_shard(out, 0, planned, staging, spec)
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": [entry]})
    return out


@pytest.fixture(scope="module")
def shards(tiny_target, tmp_path_factory):
    d = tmp_path_factory.mktemp("parity")
    deep = deeper_target(tiny_target, d / "deep-target")
    return {"tiny": capture(tiny_target, [0, 1, 2], d / "tiny-shards"),
            "deep": capture(deep, [2, 3, 4], d / "deep-shards"), "deep_target": deep}


def test_shards_of_the_reference_itself_pass(shards, tiny_target):
    report = parity_report(shards["tiny"], tiny_target)
    assert report["ok"] and report["samples"] == 4 and report["verified"] == 4
    assert [x["reference_index"] for x in report["aux"]] == [1, 2, 3]
    assert all(x["cos"] > 0.999 for x in report["aux"]) and report["last"]["cos"] > 0.999


def test_shards_claiming_layers_the_reference_lacks_are_refused(shards, tiny_target):
    manifest = shards["deep"] / "manifest.json"
    with pytest.raises(EagleboxError, match=r"name the inputs of layers \[4, 5\], which the reference .*config.json "
                                            r"\(4 layers: inputs 0..3\) does not have; point model.path at"):
        parity_report(shards["deep"], tiny_target)
    assert str(manifest) in _message(lambda: parity_report(shards["deep"], tiny_target))
    # the same shards against the target they came from pass
    assert parity_report(shards["deep"], shards["deep_target"], num_samples=2)["ok"]


def test_the_cli_refuses_them_in_one_line(shards):
    r = eaglebox_cli("parity", "--config", str(TINY_CONFIG), f"extract.output_dir={shards['deep']}")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "captured_layer_inputs [3, 4, 5]" in r.stderr, r.stderr
    assert "IndexError" not in r.stderr and r.stdout == ""


def test_a_feature_file_changed_on_disk_is_refused(shards, tiny_target, tmp_path):
    copy = shutil.copytree(shards["tiny"], tmp_path / "shards")
    sample = sorted((copy / "shard-00000").iterdir())[1]
    data = bytearray(sample.read_bytes())
    data[-2] ^= 0x40  # one feature value of the last row
    sample.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=f"{sample.name}: its tensors' sha256 differs from manifest.json"):
        parity_report(copy, tiny_target)


def _message(fn) -> str:
    try:
        fn()
    except EagleboxError as err:
        return str(err)
    raise AssertionError("not refused")
