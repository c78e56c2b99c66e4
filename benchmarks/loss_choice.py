"""The draft's loss: soft cross entropy vs LK^alpha (``train.loss``), same shards, same steps, paired by seed.

For each seed, ``eaglebox train`` (the CLI users run) trains the tiny target's draft twice on the same
shards, once with ``train.loss=soft_ce`` and once with ``train.loss=lk_alpha``; everything else is the
same (the seed fixes the held-out split, the batch order and the initial weights, so the two runs of a
seed differ only in the loss). Each last-step draft (``train.export=last``) is then scored by the
acceptance gate's offline evaluator (``eaglebox.draft.offline.evaluate_draft``: SGLang's
``LlamaForCausalLMEagle3``, chain of ``serve.num_steps``, greedy verification) on the seed's held-out
requests, never trained on. AL = completion tokens / verify steps over those requests.

Without ``--shards``, the shards are captured first by the real SGLang server on the CPU
(``eaglebox extract --config C``, ``--samples`` samples, answers regenerated as the config says).

    python benchmarks/loss_choice.py [--config configs/tiny-cpu.yaml] [--shards DIR] [--out runs/loss-choice]
        [--steps 300] [--seeds 0 1 2] [--result FILE] [key=value ...]

``key=value`` are config overrides applied to every run (e.g. ``train.lr=1e-3``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ("soft_ce", "lk_alpha")


def settings(a, seed: int) -> list[str]:
    """The overrides of one seed's runs (the loss and the output folder come on top)."""
    return [f"extract.output_dir={a.shards}", f"train.max_steps={a.steps}", f"train.batch_size={a.batch_size}",
            f"train.ttt_length={a.ttt}", f"train.max_length={a.max_length}", f"train.lr={a.lr}",
            f"train.warmup_steps={a.warmup}", f"train.seed={seed}", f"train.heldout_share={a.heldout_share}",
            "train.eval_max_samples=1",  # the trainer's own held-out check; the figures come from evaluate()
            "train.epochs=100000", "train.export=last", "train.dtype=float32", "train.checkpoint_every=100000",
            f"serve.num_steps={a.num_steps}", *a.overrides]


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` from the repository root, its output going to ``log`` as it comes."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{log.read_text()[-6000:]}")


def extract(a) -> float:
    from eaglebox.engine.server import free_port

    t0 = time.monotonic()
    run_logged([sys.executable, "-m", "eaglebox.cli", "extract", "--config", str(a.config),
                f"extract.output_dir={a.shards}", f"extract.max_samples={a.samples}", "extract.shard_size=64",
                f"extract.max_length={a.max_length}", f"engine.port={free_port()}", *a.overrides],
               a.out / "extract.log")
    return time.monotonic() - t0


def train(a, seed: int, loss: str) -> dict:
    out = a.out / f"seed{seed}-{loss}"
    t0 = time.monotonic()
    run_logged([sys.executable, "-m", "eaglebox.cli", "train", "--config", str(a.config), *settings(a, seed),
                f"train.loss={loss}", f"train.output_dir={out}"], out.with_suffix(".log"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    report = json.loads((out / "report.json").read_text())
    assert report["loss"] == loss and report["steps"] == a.steps, report
    return {"draft": str(out / "draft"), "train_s": round(time.monotonic() - t0, 1), "final_loss": rows[-1]["loss"],
            "final_acc_per_position": rows[-1]["acc_per_position"]}


def evaluate(a, seed: int, drafts: dict[str, str]) -> tuple[dict, int, int]:
    """Each draft through the gate's offline evaluator on the seed's held-out requests."""
    from eaglebox.config.load import load_config
    from eaglebox.draft.offline import evaluate_draft
    from eaglebox.shards.format import ShardReader
    from eaglebox.target.weights import load_embed_and_head
    from eaglebox.train import heldout

    cfg = load_config(a.config, settings(a, seed))
    t = cfg.train
    reader = ShardReader(cfg.extract.output_dir)
    _, held_ids = heldout.split(len(reader), t.heldout_share, t.seed)
    samples = heldout.requests(reader, held_ids, t.max_length, a.eval_samples)
    if not samples:
        raise SystemExit("no held-out sample has a prompt and an answer to score")
    embed, _ = load_embed_and_head(Path(cfg.model.path))
    return ({name: evaluate_draft(Path(d), embed.float(), samples, cfg.serve.num_steps,
                                  reader.capture.engine_version, "cpu") for name, d in drafts.items()},
            len(held_ids), len(samples))


def table(results: list[dict], a) -> str:
    lines = [f"{'seed':>4s} {'loss':9s} {'AL':>6s} {'compl':>6s} {'verify':>6s} {'AL/req mean':>11s} "
             f"{'accept rate per position':>26s} {'own loss':>9s} {'acc0':>5s} {'train s':>7s}"]
    for r in results:
        for loss in LOSSES:
            s, tr = r["scores"][loss], r["runs"][loss]
            per_req = s["accept_length_per_request"]
            pos = ", ".join("-" if x is None else f"{x:.3f}" for x in s["accept_rate_per_position"])
            lines.append(f"{r['seed']:4d} {loss:9s} {s['accept_length']:6.3f} {s['completion_tokens']:6d} "
                         f"{s['verify_ct']:6d} {sum(per_req) / len(per_req):11.3f} {pos:>26s} "
                         f"{tr['final_loss']:9.4f} {tr['final_acc_per_position'][0]:5.2f} {tr['train_s']:7.1f}")
        lines.append(f"{r['seed']:4d} lk/soft_ce AL {r['ratio']:.3f}  ({r['requests']} of {r['heldout']} held-out "
                     "samples scored)")
    lines.append("")
    for loss in LOSSES:
        als = [r["scores"][loss]["accept_length"] for r in results]
        lines.append(f"{loss:9s} held-out AL over {len(als)} seeds: median {statistics.median(als):.3f}, "
                     f"worst {min(als):.3f}, best {max(als):.3f}")
    ratios = [r["ratio"] for r in results]
    lines.append(f"lk_alpha / soft_ce AL, paired by seed: median {statistics.median(ratios):.3f}, "
                 f"worst {min(ratios):.3f}, best {max(ratios):.3f}")
    lines.append(f"AL = completion tokens / verify steps over each seed's held-out requests (never trained on), "
                 f"chain of {a.num_steps}, greedy verification, SGLang's draft class (evaluate_draft). own loss: "
                 "each run's logged objective at its last step (soft CE or -log alpha: not comparable); acc0: "
                 "its top-1 accuracy at TTT position 0 on that step's batch")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny-cpu.yaml")
    ap.add_argument("--shards", type=Path, help="shards made by `eaglebox extract` with --config; "
                                                "default: captured into OUT/shards")
    ap.add_argument("--samples", type=int, default=384, help="samples to capture when --shards is not given")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "loss-choice")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ttt", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=320)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--heldout-share", type=float, default=0.15)
    ap.add_argument("--eval-samples", type=int, default=48)
    ap.add_argument("--num-steps", type=int, default=3, help="serve.num_steps: the evaluator's chain length")
    ap.add_argument("--result", type=Path, help="also write the output here")
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value) for every run")
    a = ap.parse_args()
    a.out = a.out.resolve()
    t0 = time.monotonic()
    extract_s = None
    if a.shards is None:
        a.shards = a.out / "shards"
        if not (a.shards / "manifest.json").exists():
            extract_s = extract(a)
    a.shards = a.shards.resolve()

    import torch

    from eaglebox.config.load import load_config
    from eaglebox.shards.format import ShardReader
    from eaglebox.shards.spec import engine_version

    results = []
    for seed in a.seeds:
        runs = {loss: train(a, seed, loss) for loss in LOSSES}
        scores, held, requests = evaluate(a, seed, {loss: r["draft"] for loss, r in runs.items()})
        results.append({"seed": seed, "runs": runs, "scores": scores, "heldout": held, "requests": requests,
                        "ratio": scores["lk_alpha"]["accept_length"] / scores["soft_ce"]["accept_length"]})
        print(f"seed {seed}: AL soft_ce {scores['soft_ce']['accept_length']:.3f}, lk_alpha "
              f"{scores['lk_alpha']['accept_length']:.3f}", file=sys.stderr, flush=True)
    cfg = load_config(a.config, settings(a, a.seeds[0]))
    reader = ShardReader(a.shards)
    t = cfg.train
    cmd_line = " ".join(["python", "benchmarks/loss_choice.py", *sys.argv[1:]])
    head = (f"# command: {cmd_line}\n# benchmarks/loss_choice.py: {len(reader)} samples in {a.shards} "
            f"(captured by SGLang {reader.capture.engine_version}"
            + (f" in {extract_s:.0f} s" if extract_s else "") + f"; SGLang here: {engine_version()}), target "
            f"{cfg.model.path} (weights {reader.capture.target.weights_digest[:12]}); per run {a.steps} steps x "
            f"batch {t.batch_size}, max_length {t.max_length}, TTT {t.ttt_length}, lr {t.lr} (warmup "
            f"{t.warmup_steps}, cosine to {t.min_lr_ratio}), clip {t.max_grad_norm}, loss decay {t.loss_decay}, "
            f"fp32; draft vocab {t.draft.draft_vocab_size}; held-out share {t.heldout_share}, seeds "
            f"{a.seeds} (each seed: its own split, batch order and initial weights, the same for both losses)\n"
            f"# machine: {platform.machine()} {os.cpu_count()} CPUs "
            f"({platform.processor() or platform.platform()}), torch {torch.__version__}, CPU; "
            f"wall {time.monotonic() - t0:.0f} s")
    text = head + "\n" + table(results, a)
    print(text)
    (a.out / "result.json").write_text(json.dumps(results, indent=1) + "\n")
    if a.result:
        a.result.write_text(text + "\n\n" + json.dumps([{k: r[k] for k in ("seed", "ratio", "heldout", "requests")}
                                                         | {"al": {x: r["scores"][x]["accept_length"] for x in LOSSES}}
                                                         for r in results]) + "\n")


if __name__ == "__main__":
    main()
