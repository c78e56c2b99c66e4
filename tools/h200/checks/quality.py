"""H200: issue 19 item 3 at a realistic width -- eaglebox's trainer vs SpecForge 0.2.0's on the same
shards, same budget, one evaluator, with a draft of Llama-3.1-8B's width (hidden 4096, 32 heads,
8 KV heads, intermediate 14336).

No model hub reaches the device, so the target is made here: a 4-layer Llama of hidden 4096 with the
tiny target's tokenizer (vocab 2048), trained for a minute on the tiny target's task corpus
(``eaglebox tiny``'s train.jsonl, carried as ``tasks.jsonl.xz``; answers-only loss as in
``eaglebox_dev.tiny.RECIPE``). Then, through eaglebox's own commands on real SGLang 0.5.23 (CUDA
graphs, triton attention, the sgl_kernel stand-in): ``eaglebox extract`` regenerates each answer with
the target and captures the features; ``benchmarks/train_quality.py`` trains both drafts on those
shards (SpecForge with flex attention and torch.compile, as it runs on GPUs) and scores both with the
gate's evaluator (SGLang's ``LlamaForCausalLMEagle3`` on the GPU) on the same held-out requests.

    bash tools/h200/run.sh quality [--quick] [--stage data|train|all]
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/h200-quality")
TINY = ROOT / "src" / "eaglebox_dev" / "assets" / "tiny-target"
CARRY = ROOT / ".cache" / "h200" / "carry"
TARGET = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128, "num_hidden_layers": 4}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@functools.cache
def task_rows() -> list[str]:
    """The carried task corpus, one JSON row a line: its first rows train the target, its last are
    extracted (decompressed once a process)."""
    return lzma.decompress((CARRY / "tasks.jsonl.xz").read_bytes()).decode().splitlines()


def conversations(n: int) -> list[list[dict]]:
    return [json.loads(r)["messages"] for r in task_rows()[:n]]


def make_target(steps: int, convs: int) -> Path:
    """The wide target: tiny's tokenizer and config, Llama-3.1-8B's width, answers-only LM training."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eaglebox_dev.tiny import answer_stream, train_lm

    path = WORK / "target"
    if (path / "model.safetensors").exists():
        return path
    tok = AutoTokenizer.from_pretrained(TINY)
    t0 = time.monotonic()
    ids, mask, starts = answer_stream(tok, conversations(convs))
    log(f"target: {len(ids):,} tokens of {convs} conversations tokenized in {time.monotonic() - t0:.0f} s")
    raw = json.loads((TINY / "config.json").read_text())
    raw.update(TARGET, dtype="float32")
    config = LlamaConfig.from_dict(raw)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).cuda()
    t0 = time.monotonic()
    recipe = {"steps": steps, "seq_len": 256, "batch_size": 32, "lr": 6e-4, "seed": 0}
    train_lm(model, ids, recipe, mask=mask, starts=starts, device="cuda", log=log)
    log(f"target: {steps} steps in {time.monotonic() - t0:.0f} s")
    save_target(model, path, [TINY / f for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                                  "generation_config.json")])
    del model
    return path


def write_config(target: Path, samples: int) -> Path:
    """configs/tiny-cpu.yaml with the wide target, the GPU engine and the device's paths."""
    raw = yaml.safe_load((ROOT / "configs" / "tiny-cpu.yaml").read_text())
    data = WORK / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text("\n".join(task_rows()[-samples:]) + "\n")  # not the target's first conversations
    raw["model"]["path"] = str(target)
    raw["engine"] = {"device": "cuda", "port": 31500, "attention_backend": "triton", "mem_fraction_static": 0.4,
                     "startup_timeout_s": 500, "extra_args": ["--sampling-backend", "pytorch", "--cuda-graph-max-bs-decode", "64"]}
    raw["extract"].update(dataset=str(data / "train.jsonl"), output_dir=str(WORK / "shards"), max_samples=samples,
                          concurrency=64, shard_size=256, regenerate_max_new_tokens=64)
    raw["train"]["output_dir"] = str(WORK / "train")
    raw["serve"]["draft_path"] = str(WORK / "train" / "draft")
    raw["bench"].update(prompts=str(data / "train.jsonl"), output_dir=str(WORK / "bench"))
    path = WORK / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a short pass of every stage (debugging the check)")
    ap.add_argument("--stage", choices=["data", "train", "all"], default="all",
                    help="data: target + extract; train: the two trainers on them. A device call is at most "
                         "10 minutes: run data, then train in the next call while the machine is still warm "
                         "(/tmp survives only then)")
    ap.add_argument("--budget-s", type=float, default=560, help="stop the trainers and keep their logs by then")
    a = ap.parse_args()
    start = time.monotonic()
    target_steps, convs, samples, steps = (60, 2000, 192, 20) if a.quick else (500, 12000, 1024, 240)
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "0"}  # SpecForge's flex attention needs torch.compile
    cfg = WORK / "config.yaml"
    if a.stage in ("data", "all"):
        target = make_target(target_steps, convs)
        cfg = write_config(target, samples)
        shutil.copy(cfg, OUT / "config.yaml")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "eaglebox.cli", "extract", "--config", str(cfg)], cwd=ROOT, env=env)
        log(f"extract: exit {r.returncode} in {time.monotonic() - t0:.0f} s")
        for f in ("corpus.json", "manifest.json"):
            if (WORK / "shards" / f).exists():
                shutil.copy(WORK / "shards" / f, OUT / f)
        if r.returncode or a.stage == "data":
            sys.exit(r.returncode)
    cmd = [sys.executable, "benchmarks/train_quality.py", "--config", str(cfg), "--shards", str(WORK / "shards"),
           "--out", str(WORK / "result"), "--steps", str(steps), "--batch-size", "16", "--warmup", "20",
           "--lr", "6e-4", "--max-length", "512", "--eval-samples", "32", "--heldout-share", "0.05",
           "--backend", "flex_attention", "--result", str(OUT / "train_quality-h200.txt"), "train.eval_every=100"]
    log("quality: " + " ".join(cmd[1:]))
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=a.budget_s - (t0 - start)).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    log(f"quality: exit {rc} in {time.monotonic() - t0:.0f} s")
    result = WORK / "result"
    for f in [result / "eaglebox-train.log", result / "specforge-train.log",
              *(result / "eaglebox" / n for n in ("metrics.jsonl", "evals.jsonl", "report.json"))]:
        if f.exists():
            shutil.copy(f, OUT / (f.name if f.parent == result else f"eaglebox-{f.name}"))
    sys.exit(rc)


if __name__ == "__main__":
    main()
