"""The side-by-side bench's bookkeeping (``eaglebox.bench.rounds``): which servers run, how outputs are
diffed against the target's, and how rounds become speed-ups. The servers themselves run in
tests/integration/test_export_and_gate.py (CPU) and tools/h200/checks/served.py (GPU)."""

from pathlib import Path

import pytest

from eaglebox.bench.rounds import differences, requests_at, server_cfg, summarize, variants
from eaglebox.config import ConfigError, load_config
from eaglebox.config.schema import Chain

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "configs" / "h200-served.yaml"


def test_variants_put_the_control_beside_the_first_chain_and_sweep_the_rest():
    cfg = load_config(GPU)
    names = [v.name for v in variants(cfg, Path("/tmp/control"))]
    assert names == ["trained 3/1/4", "control 3/1/4", "trained 5/1/6", "trained 5/8/32"]
    assert [v.name for v in variants(cfg, None)] == ["trained 3/1/4", "trained 5/1/6", "trained 5/8/32"]
    plain = load_config(ROOT / "configs" / "tiny-cpu-served.yaml")  # no chains: the serve section's
    assert [v.name for v in variants(plain, None)] == ["trained 3/1/4"]


def test_server_cfg_sets_port_draft_and_chain_and_leaves_the_rest():
    cfg = load_config(GPU)
    v = variants(cfg, Path("/tmp/control"))[3]
    s = server_cfg(cfg, 12345, v)
    assert (s.engine.port, s.serve.num_steps, s.serve.eagle_topk, s.serve.num_draft_tokens) == (12345, 5, 8, 32)
    assert s.engine.extra_args == cfg.engine.extra_args and cfg.engine.port == 31601
    assert server_cfg(cfg, 1, None).serve.draft_path is None


def test_requests_at_sends_at_least_one_wave():
    prompts = [[i] for i in range(16)]
    assert len(requests_at(prompts, 1, 6)) == 6
    assert len(requests_at(prompts, 16, 6)) == 16
    assert len(requests_at(prompts, 1, None)) == 16


def test_differences_name_the_first_differing_token_and_count_the_rest():
    ref = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    spec = [[1, 2, 3, 4], [5, 0, 7, 1], [8]]
    d = differences(spec, ref)
    assert d == [{"prompt": 1, "first_diff_at": 1, "spec_len": 4, "target_len": 3, "differing_tokens": 2},
                 {"prompt": 2, "first_diff_at": 1, "spec_len": 1, "target_len": 2, "differing_tokens": 1}]
    assert differences(ref, ref) == []


def run(server, rnd, c, tps, al=None):
    row = {"server": server, "round": rnd, "concurrency": c, "tokens_per_s": tps}
    if al is not None:
        row |= {"accept_length": al, "accept_rate_per_position": [0.9, 0.8, 0.7]}
    return row


def test_summary_ratios_are_per_round_against_that_rounds_target_and_report_the_worst():
    report = {"concurrency": [1], "variants": ["trained 3/1/4", "control 3/1/4", "trained 5/1/6"],
              "equality": [{"differing_tokens": 0}, {"differing_tokens": 3}],
              "first_difference_top2": [{"gap": 0.01}, {"error": "x"}],
              "runs": [run("target", 1, 1, 100), run("trained 3/1/4", 1, 1, 250, 3.1), run("control 3/1/4", 1, 1, 80, 1.0),
                       run("target", 2, 1, 50), run("trained 3/1/4", 2, 1, 100, 3.0), run("control 3/1/4", 2, 1, 40, 1.0),
                       # a second batch: its own target runs, the same round numbers
                       run("target", 1, 1, 200), run("trained 5/1/6", 1, 1, 600, 3.6)]}
    s = summarize(report)
    rows = {r["variant"]: r for r in s["per_variant"]}
    assert rows["trained 3/1/4"]["speedup_per_round"] == [2.5, 2.0]
    assert rows["trained 3/1/4"]["speedup_worst"] == 2.0 and rows["trained 3/1/4"]["speedup_median"] == 2.25
    assert rows["control 3/1/4"]["speedup_per_round"] == [0.8, 0.8]
    assert rows["trained 5/1/6"]["speedup_per_round"] == [3.0]  # against its own batch's target run
    assert s["best_chain_per_concurrency"][1]["chain"] == "5/1/6"  # the control never counts as best
    assert s["differing_tokens"] == 3 and s["max_top2_gap_at_first_difference"] == 0.01


def test_chain_label():
    assert Chain(num_steps=5, eagle_topk=8, num_draft_tokens=32).label() == "5/8/32"


def test_a_running_target_and_a_running_target_plus_draft_are_not_benched_together():
    """``bench.target_url`` (the target the rounds compare against, test_mla_served.py serves two drafts
    beside one) and ``bench.url`` (a target + draft server measured alone) exclude each other."""
    cfg = load_config(GPU, ["bench.target_url=http://127.0.0.1:1/"])
    assert cfg.bench.target_url == "http://127.0.0.1:1/" and cfg.bench.url is None
    with pytest.raises(ConfigError, match="bench.target_url is the target the side-by-side rounds compare against"):
        load_config(GPU, ["bench.target_url=http://127.0.0.1:1", "bench.url=http://127.0.0.1:2"])
