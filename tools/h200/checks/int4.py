"""H100/H200, issue 43: train as you infer, measured on an INT4 MoE target served by SGLang 0.5.23.

Three drafts of one INT4 DeepSeek-V3 target, the same prompts and training budget, differing only in their
features (docs/train-as-you-infer.md):

- (a) captured by ``eaglebox extract`` through SGLang's own INT4 MoE path (train as you infer);
- (b) another engine's numerics: a transformers bf16 forward on the dequantized weights (the role vLLM
  played in the failure eaglebox exists for), written for (a)'s samples in eaglebox's shard format by
  eaglebox's own writer (``capture.sink.write_sample``, ``extract.commit.commit_shard``);
- (c) (a)'s draft with its layer ids read in the other convention (``target.layers.convert_layer_ids``):
  trained on the inputs of layers 2, 3, 4, served where SGLang hooks 3, 4, 5. Training it on (a)'s
  features relabelled would give (a)'s weights again (same features, seed and budget), so it is (a)'s
  draft relabelled; the layer convention, not the weights, is what (c) varies.

Stages, each skipped when its output exists (a run cut short continues where it stopped):

1. **target**: the shipped tiny DeepSeek-V3 target (5 trained layers) padded to 7 (two pass-through MoE
   layers: zero ``o_proj`` and ``down_proj``) so (c)'s shifted inputs exist; ``eaglebox_dev.int4`` writes it
   in Kimi-K2.5's INT4 format and as dequantized bf16; the padding's logits are checked against the 5 layers.
2. **greedy**: SGLang serves the INT4 target and the dequantized one; their greedy outputs compared.
3. ``eaglebox extract``: (a).
4. **other engine**: (b), and the distance of (a) and (b) per captured layer (cos, relative error).
5. **train**: (a) and (b) with the same config, each on its own shards, for each ``--seeds``; (c) relabelled.
6. **refusals**: ``eaglebox``'s serve-time provenance check on (b) and (c) against the INT4 target.
7. **offline**: AL of (a) and (b) on held-out (a)-features (SGLang's draft class, chain drafting).
8. **bench** (GPU): ``eaglebox bench`` of each draft on the INT4 target, ``bench.rounds`` alternating
   rounds (refusals overridden by ``serve.allow_provenance_mismatch``), the random control with (a).

Like ``served.py``, a worker in its own session runs the stages and each call follows it (``--follow-s``).
``--smoke`` runs the flow on the CPU (configs/int4-smoke-cpu.yaml): SGLang 0.5.23 cannot serve the INT4
target there, so (a) comes from the padded bf16 target in float32, the greedy stage serves that target next
to the dequantized twin, and the bench is left out.

    bash tools/h200/run.sh int4 --follow-s 550

Every output sits in the folder of the config's ``model.path`` (``/tmp/h200-int4``; the smoke config's
``/tmp/int4-smoke``).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import follow, log_line, save_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
CARRY = ROOT / ".cache" / "h200" / "carry" / "tiny-mla"  # train.jsonl.xz, heldout.jsonl (docs/train-as-you-infer.md)
WORK = Path("/tmp/h200-int4")
CONFIG = ROOT / "configs" / "h200-int4.yaml"
DEVICE = "cuda"
OTHER_ENGINE_MODEL = "target-dequant"
"""The weights (b)'s engine runs: what (a)'s engine computes with, as transformers can run it (the INT4
target dequantized). --smoke captures (a) from the bf16 target, so (b) runs that: the engines' distance alone."""
LAYERS = 7
START = time.monotonic()
RESULT: dict = {}


def log(msg: str) -> None:
    log_line(WORK / "int4.log", msg, START)


def save() -> None:
    save_json(WORK / "int4.json", RESULT)


def cfg_now(*overrides: str):
    from eaglebox.config import load_config

    return load_config(CONFIG, list(overrides))


def variant(name: str, seed: int) -> list[str]:
    """The overrides of draft ``name`` (a, b, c) at ``seed``: its shards, training output and bench output."""
    shards = WORK / f"shards-{'b' if name == 'b' else 'a'}"
    train = WORK / f"train-{name}-s{seed}"
    return [f"extract.output_dir={shards}", f"train.output_dir={train}", f"train.seed={seed}",
            f"serve.draft_path={train / 'draft'}", f"bench.output_dir={WORK / f'bench-{name}-s{seed}'}"]


# ---------------------------------------------------------------- target

def pad_layers(src: Path, out: Path, layers: int) -> Path:
    """``src``'s layers, then copies of its last (MoE) layer up to ``layers`` with zero ``o_proj`` and zero
    ``down_proj`` (routed and shared experts): each adds exactly 0 to the residual stream. A 5-layer
    DeepSeek-V3 can capture only the inputs of 2, 3, 4 (SGLang adds 1 to every id when the first is 1), so
    the inputs of 3, 4, 5 that (c) is served with need the input of layer 5: the output of trained layer 4."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    state = load_file(src / "model.safetensors")
    last = f"model.layers.{n - 1}."
    for i in range(n, layers):
        for k, v in [(k, v) for k, v in state.items() if k.startswith(last)]:
            zero = k.endswith(("self_attn.o_proj.weight", "down_proj.weight"))
            state[f"model.layers.{i}." + k[len(last):]] = torch.zeros_like(v) if zero else v.clone()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "eaglebox-*"))
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    cfg["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def check_pass_through(src: Path, padded: Path) -> float:
    """Max |logit| difference of the padded target against the one it was padded from (HF, bf16)."""
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 17, 301, 44, 1020, 7, 99, 3]], device=DEVICE)
    outs = []
    with torch.no_grad():
        for p in (src, padded):
            m = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).to(DEVICE).eval()
            outs.append(m(ids).logits.float())
    return float((outs[0] - outs[1]).abs().max())


def stage_target() -> None:
    from eaglebox_dev import int4, tiny_mla

    if (WORK / "target-dequant" / "config.json").exists():
        return
    tiny = tiny_mla.make_tiny_mla_target(WORK / "tiny", log=log)
    bf16 = pad_layers(tiny, WORK / "target-bf16", LAYERS)
    summary = int4.quantize_target(bf16, WORK / "target-int4", WORK / "target-dequant", log=log)
    diff = check_pass_through(tiny, bf16)
    RESULT["target"] = {"made": f"tiny_mla's 5 trained layers + {LAYERS - 5} pass-through", "int4": summary,
                        "pass_through_max_abs_logit_diff": diff}
    log(f"target: padded to {LAYERS} layers (logits max abs diff {diff}); INT4 and dequantized bf16 written")
    save()


def write_data() -> None:
    """The tiny chat data where the config names it (carried as train.jsonl.xz and heldout.jsonl)."""
    cfg = cfg_now()
    for path, src in ((Path(cfg.extract.dataset), CARRY / "train.jsonl.xz"), (Path(cfg.bench.prompts), CARRY / "heldout.jsonl")):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(lzma.decompress(src.read_bytes()) if src.suffix == ".xz" else src.read_bytes())


# ---------------------------------------------------------------- greedy equality (GPU)

SERVED_PAIR = (("int4", "target-int4"), ("dequantized_bf16", "target-dequant"))
"""What the greedy stage serves side by side. --smoke: the bf16 target and the dequantized twin (SGLang
serves no INT4 target on a CPU), i.e. what int4 rounding alone does to greedy output."""


def stage_greedy(new: int = 64) -> None:
    """:data:`SERVED_PAIR` served by SGLang side by side, greedy, the bench's prompts: where their outputs
    first differ, per prompt. The INT4 kernel computes q * scale in bf16 as the twin holds it, so on the GPU
    differences come from the kernels' arithmetic, not the weights."""
    from eaglebox.bench.rounds import differences, server_cfg
    from eaglebox.bench.served import run_prompts
    from eaglebox.engine.launch import server_for
    from eaglebox.engine.server import free_port
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.target.tokenizer import load_tokenizer

    if "greedy" in RESULT:
        return
    cfg = cfg_now()
    prompts = heldout_prompts(cfg, load_tokenizer(cfg.model))
    servers = {name: server_for(server_cfg(cfg_now(f"model.path={WORK / d}"), free_port(), None), "plain",
                                WORK / "logs" / f"greedy-{name}.log") for name, d in SERVED_PAIR}
    try:
        for s in servers.values():
            s.launch()
        outs = {}
        for name, s in servers.items():
            s.wait()
            outs[name] = run_prompts(s.url, prompts, new, 16)["outputs"]
    finally:
        for s in servers.values():
            s.stop()
    (a, _), (b, _) = SERVED_PAIR
    diffs = differences(outs[a], outs[b])
    RESULT["greedy"] = {"served": [n for n, _ in SERVED_PAIR], "prompts": len(prompts), "new_tokens": new,
                        "identical": len(prompts) - len(diffs), "first_differences": diffs}
    log(f"greedy: {len(prompts) - len(diffs)}/{len(prompts)} outputs identical, {a} vs {b}")
    save()


# ---------------------------------------------------------------- (b): another engine's features

def other_engine_spec(spec_a, model):
    """(a)'s capture spec with what made (b): transformers (its version), the fingerprint of the weights it
    ran, bf16, its attention implementation, no quantization or MoE runner."""
    import transformers

    from eaglebox.shards.contract import CaptureSpec
    from eaglebox.target.fingerprint import target_fingerprint

    return CaptureSpec.model_validate(spec_a.as_json() | {
        "engine": "transformers", "engine_version": transformers.__version__, "dtype": "bfloat16", "dtype_bytes": 2,
        "target": target_fingerprint(WORK / OTHER_ENGINE_MODEL),
        "engine_options": {"quantization": None, "dtype": "bfloat16",
                           "attention_backend": model.config._attn_implementation, "moe_runner_backend": None,
                           "kv_cache_dtype": None, "tp": 1, "dp": 1, "ep": 1}})


def write_shards(reader, spec, out: Path, features) -> None:
    """``reader``'s samples (same ids, masks and shards) with ``features(input_ids) -> (aux, last)``, written
    as the capture server writes a sample and committed as ``eaglebox extract`` commits a shard."""
    from eaglebox.capture.sink import write_sample
    from eaglebox.extract.commit import ManifestLedger, commit_shard
    from eaglebox.extract.plan import Planned, sample_id
    from eaglebox.shards.format import FORMAT

    staging = out / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    ledger = ManifestLedger(out, {"format": FORMAT, "capture": spec.as_json(), "shards": [],
                                  "dataset": reader.manifest.get("dataset")})
    i = 0
    for index, shard in enumerate(reader.manifest["shards"]):
        planned = []
        for entry in shard["samples"]:
            ids, mask = reader.ids_and_mask(i)
            i += 1
            p = Planned(sample_id(ids.tolist(), spec), entry["line"], ids.tolist(), mask.tolist())
            aux, last = features(ids)
            write_sample(staging / f"{p.id}.safetensors", ids, [aux], [last], spec.sample_header())
            planned.append(p)
        ledger.record(commit_shard(out, index, planned, staging, spec))
    ledger.save()
    shutil.rmtree(staging)


def distance(a, b) -> dict:
    """Per captured layer and for the last hidden state: cosine of the whole tensors, the mean and least row
    cosine, and ||a - b|| / ||a||, over every token of every sample (float64)."""
    H = a.capture.hidden_size
    names = [f"input_of_layer_{i}" for i in a.capture.layers.captured_layer_inputs] + ["last"]
    acc = {n: {"dot": 0.0, "aa": 0.0, "bb": 0.0, "dd": 0.0, "rows": []} for n in names}
    for i in range(len(a)):
        sa, sb = a.get(i), b.get(i)
        for k, n in enumerate(names):
            x = (sa["aux"][:, k * H:(k + 1) * H] if n != "last" else sa["last"]).double()
            y = (sb["aux"][:, k * H:(k + 1) * H] if n != "last" else sb["last"]).double()
            r = acc[n]
            r["dot"] += float((x * y).sum())
            r["aa"] += float((x * x).sum())
            r["bb"] += float((y * y).sum())
            r["dd"] += float(((x - y) ** 2).sum())
            r["rows"].append(torch.nn.functional.cosine_similarity(x, y, dim=-1))
    out = {}
    for n, r in acc.items():
        rows = torch.cat(r["rows"])
        out[n] = {"cos": round(r["dot"] / (r["aa"] * r["bb"]) ** 0.5, 6), "mean_row_cos": round(float(rows.mean()), 6),
                  "min_row_cos": round(float(rows.min()), 6), "rel_error": round((r["dd"] / r["aa"]) ** 0.5, 6)}
    return out


def stage_other_engine() -> None:
    from transformers import AutoModelForCausalLM

    from eaglebox.shards.format import ShardReader

    out = WORK / "shards-b"
    reader = ShardReader(cfg_now().extract.output_dir)
    if not (out / "manifest.json").exists():
        model = AutoModelForCausalLM.from_pretrained(WORK / OTHER_ENGINE_MODEL, dtype=torch.bfloat16).to(DEVICE).eval()
        spec = other_engine_spec(reader.capture, model)
        inputs = list(spec.layers.captured_layer_inputs)

        def features(ids):
            with torch.no_grad():
                hs = model(ids[None].to(DEVICE), output_hidden_states=True).hidden_states
            return torch.cat([hs[k][0] for k in inputs], -1).cpu(), hs[-1][0].cpu()  # hs[k]: the input of layer k

        t0 = time.monotonic()
        write_shards(reader, spec, out, features)
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        RESULT["other_engine"] = {"engine": f"transformers {spec.engine_version}", "model": f"{OTHER_ENGINE_MODEL}, bf16",
                                  "attention": spec.engine_options.attention_backend, "samples": len(reader),
                                  "s": round(time.monotonic() - t0, 1)}
    RESULT["distance_a_b"] = distance(reader, ShardReader(out, verify=True))
    log(f"other engine: (b) written; distance to (a): {json.dumps(RESULT['distance_a_b'])}")
    save()


# ---------------------------------------------------------------- train, relabel, refuse

def stage_train(name: str, seed: int) -> Path:
    """Train draft ``name`` on its own shards with the config's budget. ``eaglebox train`` refuses (b)'s
    shards (another engine and target than the config's); passing the shards' own capture spec is the
    measurement's explicit override."""
    from eaglebox.shards.format import ShardReader
    from eaglebox.train.loop import run_train

    cfg = cfg_now(*variant(name, seed))
    draft = Path(cfg.serve.draft_path)
    if not (draft / "config.json").exists():
        t0 = time.monotonic()
        run_train(cfg, ShardReader(cfg.extract.output_dir).capture, log=log)
        RESULT.setdefault("training", {})[f"{name}-s{seed}"] = {"s": round(time.monotonic() - t0, 1)}
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        save()
    return draft


def shifted_draft(draft_a: Path, out: Path) -> Path:
    """(a)'s draft with its layers read in the other convention: the inputs it was trained on taken as
    outputs (``convert_layer_ids``), so SGLang hooks the next layer of each; the ids SGLang is given for
    them by the target's rule. The ``eaglebox`` block says so, so serving sees what the draft now claims."""
    from eaglebox.target.config import num_layers
    from eaglebox.target.layers import convert_layer_ids, ids_for_inputs, layer_rule

    target = cfg_now().model.path
    _, rule = layer_rule(target)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(draft_a, out)
    cfg = json.loads((out / "config.json").read_text())
    block = cfg["eaglebox"]
    inputs = convert_layer_ids(block["captured_layer_inputs"], "output_of_layer", "input_of_layer")
    ids = ids_for_inputs(rule, inputs, num_layers(target))
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = block["layer_ids"] = ids
    block["captured_layer_inputs"] = inputs
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def refusal(draft: Path) -> list[str]:
    """eaglebox's serve-time provenance check of ``draft`` on the config's target and engine: its lines."""
    from eaglebox.errors import EagleboxError
    from eaglebox.serve.provenance import check_provenance
    from eaglebox.shards.spec import capture_spec

    cfg = cfg_now(f"serve.draft_path={draft}")
    try:
        check_provenance(cfg.serve, capture_spec(cfg))
    except EagleboxError as err:
        return str(err).splitlines()
    return []


def train_refusal() -> str:
    """What ``eaglebox train`` says of (b)'s shards under the config (its check, before any step)."""
    from eaglebox.errors import EagleboxError
    from eaglebox.shards.format import ShardReader
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.loop import check_header

    cfg = cfg_now(*variant("b", 0))
    try:
        check_header(ShardReader(cfg.extract.output_dir).capture, capture_spec(cfg), Path(cfg.extract.output_dir))
    except EagleboxError as err:
        return str(err)
    return ""


def stage_offline(name: str, draft: Path, seed: int) -> None:
    """Offline AL of ``draft`` on the held-out samples of (a)'s shards (the trainer's split at ``seed``):
    SGLang's draft class, chain drafting, the target's greedy tokens and (a)'s features."""
    from eaglebox.draft.offline import evaluate_draft
    from eaglebox.shards.format import ShardReader
    from eaglebox.target.weights import load_embed_and_head
    from eaglebox.train import heldout

    if f"{name}-s{seed}" in RESULT.get("offline", {}):
        return
    cfg = cfg_now(*variant("a", seed))
    reader = ShardReader(cfg.extract.output_dir)
    _, held = heldout.split(len(reader), cfg.train.heldout_share, seed)
    samples = heldout.requests(reader, held, cfg.train.max_length, cfg.train.eval_max_samples)
    embed, _ = load_embed_and_head(Path(cfg.model.path))
    r = evaluate_draft(draft, embed, samples, cfg.serve.num_steps, reader.capture.engine_version, DEVICE)
    RESULT.setdefault("offline", {})[f"{name}-s{seed}"] = {k: r[k] for k in ("accept_length", "accept_rate_per_position")}
    log(f"offline {name} seed {seed}: AL {r['accept_length']:.3f}")
    save()


def eaglebox(verb: str, *overrides: str, log_name: str) -> None:
    cmd = [sys.executable, "-m", "eaglebox.cli", verb, "--config", str(CONFIG), *overrides]
    log("run: eaglebox " + " ".join(cmd[3:]))
    t0 = time.monotonic()
    with open(WORK / "logs" / f"{log_name}.log", "ab") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    log(f"{verb} {log_name}: exit {rc} in {time.monotonic() - t0:.0f} s")
    if rc:
        raise RuntimeError(f"eaglebox {verb} failed; see logs/{log_name}.log")


def stage_bench(name: str, seed: int, draft: Path) -> None:
    """``eaglebox bench`` of ``draft`` on the INT4 target (the target alone, the draft, the random control;
    per-position AL, lossless check); (b) and (c) with their refusal overridden."""
    overrides = [*variant(name, seed), f"serve.draft_path={draft}"]
    if name != "a":  # the random control is measured once, with (a)
        overrides += ["serve.allow_provenance_mismatch=true", "bench.control=false"]
    bench = Path(cfg_now(*overrides).bench.output_dir)
    if not (bench / "bench.json").exists():
        eaglebox("bench", *overrides, log_name=f"bench-{name}-s{seed}")
    RESULT.setdefault("bench", {})[f"{name}-s{seed}"] = str(bench / "bench.json")
    save()


def work(a) -> None:
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    if (WORK / "int4.json").exists():
        RESULT.update(json.loads((WORK / "int4.json").read_text()))
    RESULT.setdefault("workers", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
                                             "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "none"})
    save()
    try:
        stage_target()
        if DEVICE == "cuda":
            write_data()
        stage_greedy(cfg_now().bench.max_new_tokens)
        if not (Path(cfg_now().extract.output_dir) / "manifest.json").exists():
            eaglebox("extract", *a.extract_overrides, log_name="extract")
        stage_other_engine()
        RESULT.setdefault("refusals", {})["train-b"] = train_refusal()
        for seed in a.seeds:
            drafts = {"a": stage_train("a", seed), "b": stage_train("b", seed)}
            drafts["c"] = shifted_draft(drafts["a"], WORK / f"train-c-s{seed}" / "draft")
            RESULT.setdefault("refusals", {}).update({f"{n}-s{seed}": refusal(drafts[n]) for n in ("a", "b", "c")})
            save()
            for name in ("a", "b"):  # (c) offline on (a)'s features is (a): its mismatch exists only served
                stage_offline(name, drafts[name], seed)
            if DEVICE == "cuda":
                for name in ("a", "c", "b"):  # (c) before (b): (b) has an offline AL, (c) shows only served
                    stage_bench(name, seed, drafts[name])
        RESULT["done"] = True
    except Exception as err:
        RESULT.setdefault("errors", []).append(f"{type(err).__name__}: {err}")
        log(f"ERROR {type(err).__name__}: {err}")
        raise
    finally:
        save()


# ---------------------------------------------------------------- worker and follower (as served.py's)

def collect() -> None:
    for p in (WORK / "int4.json", WORK / "int4.log"):
        if p.exists():
            shutil.copy(p, OUT / p.name)
    with tarfile.open(OUT / "logs.tar.gz.tmp", "w:gz") as tar:
        for p in [*(WORK / "logs").glob("*.log"), WORK / "worker.log", *WORK.glob("bench-*/bench.json"),
                  *WORK.glob("train-*/metrics.jsonl"), *WORK.glob("shards-*/manifest.json")]:
            tar.add(p, arcname=str(p.relative_to(WORK)))
    (OUT / "logs.tar.gz.tmp").replace(OUT / "logs.tar.gz")


def main() -> None:
    global CONFIG, WORK, DEVICE, OTHER_ENGINE_MODEL, SERVED_PAIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--follow-s", type=float, default=570, help="return after this many seconds (the worker runs on)")
    ap.add_argument("--worker", action="store_true", help="(internal) run the stages")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="training seeds of (a) and (b); the spread of one seed comes from the bench's rounds")
    ap.add_argument("--extract-override", dest="extract_overrides", action="append", default=[])
    ap.add_argument("--smoke", action="store_true", help="the flow on the CPU (pass a CPU --config): no INT4 serving, no bench")
    a = ap.parse_args()
    CONFIG = a.config.resolve()
    cfg = cfg_now()
    WORK = Path(cfg.model.path).parent  # every stage's output sits beside the target, as the configs place them
    if Path(cfg.extract.output_dir) != WORK / "shards-a":
        ap.error(f"{CONFIG}: extract.output_dir must be {WORK / 'shards-a'} (beside model.path)")
    if a.smoke:
        DEVICE, OTHER_ENGINE_MODEL = "cpu", "target-bf16"
        SERVED_PAIR = (("bf16", "target-bf16"), ("dequantized_bf16", "target-dequant"))
        # SGLang fixes its platform when its modules are first imported (here by the greedy stage, before the
        # offline stage's draft class): the CPU engine's, as tests/conftest.py does
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    if a.worker:
        work(a)
    else:
        follow(__file__, WORK, "int4", a.follow_s, collect, START)


if __name__ == "__main__":
    main()
