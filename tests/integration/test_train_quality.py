"""Same shards, two trainers, one evaluator (issue 19, item 3), at tiny size on the CPU: eaglebox's trainer
and SpecForge 0.2.0's train the same draft on shards of the tiny target captured by real SGLang, with the
same batches and budget; both exports load in SGLang's draft class and are scored on the same held-out
requests. The goal: eaglebox's AL >= SpecForge's at equal tokens. About 3.5 min on 2 idle cores (shards ~2,
benchmark ~1.5); 7.2 min measured while another SGLang test shared the machine. The committed result at a
larger budget: benchmarks/results/train_quality-cpu.txt."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_CONFIG

pytestmark = pytest.mark.sglang  # the shards come from a real server


def test_eaglebox_and_specforge_on_the_same_shards_scored_by_one_evaluator(tiny_shards, tmp_path):
    try:
        import specforge  # noqa: F401
    except ImportError:
        pytest.fail("SpecForge is not installed: pip install --no-deps -r requirements/specforge.txt (make venv does)")
    out = tmp_path / "quality"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_quality.py"), "--config", str(TINY_CONFIG),
                        "--shards", str(tiny_shards), "--out", str(out), "--steps", "40", "--batch-size", "4",
                        "--result", str(tmp_path / "table.txt")], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "result.json").read_text())
    eb, sf = res["runs"]
    assert eb["trainer"] == "eaglebox" and sf["trainer"].startswith("specforge 0.2.0")
    # equal budget: the same 40 steps over the same batches
    assert res["budget"]["steps"] == 40
    assert eb["tokens"] == sf["tokens"] == res["budget"]["tokens"] > 0
    assert eb["answer_tokens"] == sf["answer_tokens"] == res["budget"]["answer_tokens"] > 0

    from eaglebox.draft.export import check_export

    for run in (eb, sf):  # both load as SGLang's LlamaForCausalLMEagle3 with the same shape and vocabulary
        assert check_export(run["draft"])["architectures"] == ["LlamaForCausalLMEagle3"]
    shapes = [json.loads((ROOT / run["draft"] / "config.json").read_text()) for run in (eb, sf)]
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "draft_vocab_size", "vocab_size", "rope_theta"):
        assert shapes[0][key] == shapes[1][key], key

    s_eb, s_sf = res["scores"]["eaglebox"], res["scores"][sf["trainer"]]
    assert s_eb["requests"] == s_sf["requests"] == res["requests"] >= 8
    assert s_eb["completion_tokens"] == s_sf["completion_tokens"]  # the same held-out continuations
    # the benchmark's evaluator is the one the training loop uses: same AL for eaglebox's last draft
    assert s_eb["accept_length"] == pytest.approx(eb["in_loop_last_al"], abs=1e-9)
    # both trainers learned (SpecForge's export is mapped right): above the untrained draft (measured at this
    # size: untrained 1.043, SpecForge 1.179, eaglebox 1.272; ratio 1.079)
    for s in (s_eb, s_sf):
        assert s["accept_length"] > eb["untrained_al"] + 0.05, (s["accept_length"], eb["untrained_al"])
    # the goal of issue 19: eaglebox's AL >= SpecForge's at equal tokens
    assert res["al_ratio"] >= 1.0, (tmp_path / "table.txt").read_text()
    assert "eaglebox / SpecForge AL" in r.stdout
