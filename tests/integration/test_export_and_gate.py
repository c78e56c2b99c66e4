"""The export loads in SGLang's own LlamaForCausalLMEagle3 and computes what the trainer computed;
the consistency gate passes with a trained draft and fails with random weights."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_CONFIG, eaglebox_cli, free_port

pytestmark = pytest.mark.sglang

PARITY = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from eaglebox.draft.sglang_class import SGLangDraft
from eaglebox.config import load_config
from eaglebox.shards.format import ShardReader
from eaglebox.draft.spec import draft_spec
from eaglebox.target.weights import load_embed_and_head
from eaglebox.train.model import Eagle3Draft
from eaglebox.train.ttt import ttt_steps

draft_dir, shards, steps = Path(sys.argv[1]), sys.argv[2], 3
cfg = load_config(sys.argv[3])
embed, _ = load_embed_and_head(Path(cfg.model.path))
sg = SGLangDraft(draft_dir)
sg.set_embed(embed.float())
ours = Eagle3Draft(draft_spec(cfg.model.path, cfg.train.draft, 3))
weights = {k: v.float() if v.is_floating_point() else v for k, v in load_file(draft_dir / "model.safetensors").items()}
ours.load_state_dict(weights, strict=False)
ours.embed_tokens.weight.data.copy_(embed.float())
s = ShardReader(shards).get(0)
T = min(48, s["input_ids"].shape[0])
ids, aux = s["input_ids"][:T][None], s["aux"][:T].float()[None]
# the trainer's TTT unroll
w = ours.step_weights(torch.float32)
with torch.no_grad():
    normed = ttt_steps(ours, w, ids, ours.fc(aux), torch.ones(1, T, dtype=torch.bool), steps)
logits = [(x @ w["lm_head"].T)[0] for x in normed]
# SGLang: extend over 0..t, then chain steps with the true tokens, as the server drafts
worst = 0.0
for t in (5, T // 2, T - 1 - steps):
    sg.reset()
    lg, hh = sg.forward(ids[0, 1 : t + 2], aux[0, : t + 1], torch.arange(t + 1))
    worst = max(worst, (lg[-1] - logits[0][t]).abs().max().item())
    for i in range(1, steps):
        lg, hh = sg.forward(ids[0, t + 1 + i : t + 2 + i], hh[-1:], torch.tensor([t + i]))
        worst = max(worst, (lg[-1] - logits[i][t]).abs().max().item())
scale = max(l.abs().max().item() for l in logits)
print(json.dumps({"max_abs_diff": worst, "logit_scale": scale,
                  "hot_token_id_ok": bool((sg.hot_token_id == ours.t2d.nonzero().squeeze(-1)).all())}))
"""


def test_export_matches_sglang_llama_eagle3_forward(tiny_shards, tmp_path):
    out = tmp_path / "train"
    r = eaglebox_cli("train", "--config", str(TINY_CONFIG), f"extract.output_dir={tiny_shards}",
                     f"train.output_dir={out}", "train.max_steps=6", "train.batch_size=4", "train.max_length=320")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert cfg["eaglebox"]["captured_layer_inputs"] == [1, 2, 3] and cfg["eaglebox"]["engine_version"] == "0.5.23"
    assert cfg["eaglebox"]["architecture"] == "LlamaForCausalLM" and cfg["head_dim"] == 32
    p = subprocess.run([sys.executable, "-c", PARITY, str(out / "draft"), str(tiny_shards), str(TINY_CONFIG)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["hot_token_id_ok"]
    assert res["max_abs_diff"] < 1e-3 * max(1.0, res["logit_scale"]), res


@pytest.fixture(scope="module")
def gate(tiny_target, tmp_path_factory):
    """One run of the consistency gate (capture, train, export, offline acceptance)."""
    d = tmp_path_factory.mktemp("gate")
    args = ["--config", str(TINY_CONFIG), f"extract.output_dir={d / 'shards'}", f"train.output_dir={d / 'train'}"]
    r = eaglebox_cli("check", *args, f"engine.port={free_port()}", f"bench.output_dir={d / 'bench'}", timeout=1800)
    return d, args, r


def test_gate_passes_trained_and_rejects_random_weights(gate):
    d, args, r = gate
    report = json.loads((d / "bench" / "check.json").read_text())
    print(json.dumps({k: report[k]["accept_length"] for k in ("trained", "random_control")}))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert report["trained"]["accept_length"] >= 1.8  # configs/tiny-cpu.yaml's bar and why
    assert report["random_control"]["accept_length"] <= 1.3
    assert report["trained"]["engine_version"] == "0.5.23"
    assert len(report["trained"]["accept_rate_per_position"]) == 3
    # what the draft is trained on: the regenerated answers, sampled (configs/tiny-cpu.yaml), varied and not
    # looping (issue 19's goal: >= 90 % distinct; 97.5-98.6 % and no looped answer measured in
    # benchmarks/results/tiny-corpus-cpu.txt; a few looped answers of 512 are tolerated: nothing seeds the sampling)
    corpus = report["corpus"]
    assert corpus["answers"] > 400 and corpus["distinct_ratio"] >= 0.9, corpus
    assert corpus["repeated_ngram_dominant_share"] <= 0.01, corpus

    # the same gate with the bar above what the draft reaches (3 steps cap AL at 4) fails, with the numbers.
    # It resumes: no retraining, and its capture is complete and its held-out samples kept, so no server
    # starts and it scores the same samples as the first run
    r = eaglebox_cli("check", *args, f"engine.port={free_port()}", f"bench.output_dir={d / 'bench2'}",
                     "bench.min_accept_length=4.5", timeout=1800)
    assert r.returncode == 1 and "check FAILED: trained AL" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    again = json.loads((d / "bench2" / "check.json").read_text())
    assert not (d / "bench2" / "gate-server.log").exists() and "server_start_s" not in again["timings"]
    for k in ("trained", "random_control"):
        assert again[k]["accept_length_per_request"] == report[k]["accept_length_per_request"]


def test_gate_keeps_held_out_samples_only_under_their_key(gate, monkeypatch, tmp_path):
    """What the re-run above reuses is keyed by everything that decides it, and verified on read: another
    length, other prompts or another concurrency, a kept file changed on disk or an unreadable index is not
    reused (the check collects again, and says why)."""
    from eaglebox.config.load import load_config
    from eaglebox.extract.collect import HELDOUT, heldout_key, load_heldout
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.shards.spec import capture_spec
    from eaglebox.target.tokenizer import load_tokenizer

    d, args, _ = gate
    monkeypatch.chdir(ROOT)  # the config's paths, as the CLI reads them
    cfg = load_config(TINY_CONFIG, args[2:])
    spec, tok = capture_spec(cfg), load_tokenizer(cfg.model)
    prompts, n, c = heldout_prompts(cfg, tok), cfg.bench.max_new_tokens, cfg.extract.concurrency
    keep = d / "shards" / HELDOUT
    kept = load_heldout(keep, heldout_key(spec, prompts, n, c), prompts, spec)
    assert kept is not None and len(kept) == len(prompts)
    assert all(seq[:p].tolist() == prompt for (seq, _, p), prompt in zip(kept, prompts))
    assert load_heldout(keep, heldout_key(spec, prompts, n - 1, c), prompts, spec) is None
    assert load_heldout(keep, heldout_key(spec, prompts[:4], n, c), prompts[:4], spec) is None
    assert load_heldout(keep, heldout_key(spec, prompts, n, c + 1), prompts, spec) is None
    copy = tmp_path / HELDOUT
    shutil.copytree(keep, copy)
    victim = next(copy.glob("*.safetensors"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    assert load_heldout(copy, heldout_key(spec, prompts, n, c), prompts, spec) is None
    (copy / "heldout.json").write_text("{")
    said = []
    assert load_heldout(copy, heldout_key(spec, prompts, n, c), prompts, spec, said.append) is None
    assert said == [f"check: {copy / 'heldout.json'} is unreadable (Expecting property name enclosed in double "
                    "quotes: line 1 column 2 (char 1)): collecting the held-out samples again"]


SERVED = ROOT / "configs" / "tiny-cpu-served.yaml"


def test_served_speculation_equals_greedy_and_agrees_with_offline_al(gate):
    """SGLang's own EAGLE-3 path on CPU (Triton interpreter, fp32): output must equal the target's
    greedy output token for token, and its AL must agree with the offline evaluator's."""
    d, _, _ = gate
    n = 4
    # no AL bar here: 4 prompts are too few for one (CI measured 1.90 on them where the gate measured >= 2.0
    # on all 32); the bar is the gate's test, this one checks that served and offline agree
    r = eaglebox_cli("bench", "--config", str(SERVED), f"serve.draft_path={d / 'train' / 'draft'}",
                     f"engine.port={free_port()}", f"bench.output_dir={d / 'served'}", f"bench.num_prompts={n}",
                     "bench.concurrency=[1]", "bench.max_new_tokens=48", "bench.min_accept_length=null", timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    served = json.loads((d / "served" / "bench.json").read_text())
    offline = json.loads((d / "bench" / "check.json").read_text())["trained"]
    assert served["outputs_equal_target_greedy"] is True
    assert served["engine_version"] == "0.5.23"
    served_al = sum(served["acceptance"]["accept_length_per_request"]) / n
    offline_al = sum(offline["accept_length_per_request"][:n]) / n
    print(json.dumps({"served_al": served_al, "offline_al_same_prompts": offline_al,
                      "served_per_request": served["acceptance"]["accept_length_per_request"],
                      "offline_per_request": offline["accept_length_per_request"][:n]}))
    assert abs(served_al - offline_al) / offline_al < 0.15
    # the bench warmed up both servers it started itself: SGLang sent no warm-up request of its own before
    # either was ready (launch_args warmup=False; ~9 s of the speculative server's start under the interpreter)
    logs = sorted((d / "served").glob("server-*.log"))
    assert [p.name for p in logs] == ["server-target.log", "server-trained-3_1_4.log"], logs
    assert not [p.name for p in logs if sglang_warmed_up(p.read_text())]
    # the speculative server started beside the target, not after it was healthy (rounds.Bench.batch)
    target_log, spec_log = (p.read_text() for p in logs)
    assert first_stamp(spec_log) <= first_stamp(target_log[target_log.index("The server is fired up"):])


def first_stamp(log: str) -> str:
    """The first ``[YYYY-MM-DD HH:MM:SS]`` of an SGLang log (sortable as text)."""
    return re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", log).group(1)


def sglang_warmed_up(log: str) -> bool:
    """Whether the server in ``log`` answered a /generate (SGLang's own warm-up) before it said it was ready."""
    return '"POST /generate' in log[:log.index("The server is fired up and ready to roll!")]
