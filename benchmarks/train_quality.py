"""Draft quality: eaglebox's trainer vs SpecForge 0.2.0's, same shards, same budget, one evaluator.

Both trainers train the same EAGLE-3 draft (eaglebox's ``DraftSpec`` from the target and
``train.draft``) on the same shards, with the same ``d2t``/``t2d`` vocabulary (eaglebox's
``build_vocab``), the same held-out split (``eaglebox.train.heldout.split``: never trained on), the
same batches in the same order (``eaglebox.train.data.batch_indices`` + ``collate``), the same steps,
batch, LR, warm-up and cosine schedule (``eaglebox.train.loop.lr_lambda``), the same TTT length, loss
decay, gradient clip and seed. Each trainer keeps what makes it that trainer:

- eaglebox: ``eaglebox train`` (the CLI users run), ``train.export=last``.
- SpecForge: ``OnlineEagle3Model(LlamaForCausalLMEagle3, length=ttt_length)`` (``length`` is the number
  of unrolled TTT steps, what ``train.ttt_length`` is) with its ``BF16Optimizer`` (AdamW with its own
  betas over fp32 masters; its cosine scheduler replaced by eaglebox's LambdaLR so the schedule is
  equal), its loss (KL to the target's distribution over the draft vocabulary, mean over batch x
  length, weights ``loss_decay**i``) and its data convention (``TargetHead.preprocess``: ids and the
  target's last hidden state shifted left by one, the loss mask not shifted), teacher from the
  target's last hidden state and head (SpecForge's compact teacher, equal to its full one). On a
  machine without CUDA two things change, neither the arithmetic: its Triton loss kernel
  (``LogSoftmaxLoss``) is replaced by its own eager reference (``specforge.core.loss._compute_loss``,
  same value and normalisation), and ``torch.compile`` is off in its process (TORCHDYNAMO_DISABLE=1;
  its RoPE is compiled). Attention backend: ``sdpa`` on CPU (flex attention needs a GPU to be fast,
  eager sdpa is SpecForge's reference), ``--backend`` picks.

SpecForge's trained weights are exported with its own trainer->SGLang key map
(``specforge.export.to_sglang.WEIGHT_MAPS['LlamaForCausalLMEagle3']``, the identity after its checkpoint
filter drops ``draft_model.`` and the frozen embedding), checked against the keys SGLang's loader reads
(``eaglebox.draft.export.serving_keys``), written by eaglebox's ``export_draft`` with the same
``config.json`` and checked by ``check_export``. Both drafts are then scored by the acceptance gate's
offline evaluator (``eaglebox.draft.offline.evaluate_draft``: SGLang 0.5.23's LlamaForCausalLMEagle3,
chain of ``serve.num_steps``, greedy verification) on the same held-out requests.

    python benchmarks/train_quality.py --shards runs/tiny/shards [--config configs/tiny-cpu.yaml]
        [--out runs/train-quality] [--steps 40] [--batch-size 4] [--result FILE] [key=value ...]

``key=value`` are config overrides applied to both trainers (e.g. ``train.lr=1e-3``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECFORGE_VERSION = "0.2.0"


def settings(a) -> list[str]:
    """The overrides both trainers run under: the benchmark's budget on top of the config."""
    return [f"extract.output_dir={a.shards}", f"train.max_steps={a.steps}", f"train.batch_size={a.batch_size}",
            f"train.ttt_length={a.ttt}", f"train.max_length={a.max_length}", f"train.lr={a.lr}",
            f"train.warmup_steps={a.warmup}", f"train.seed={a.seed}", f"train.heldout_share={a.heldout_share}",
            f"train.eval_max_samples={a.eval_samples}", "train.epochs=100000", "train.export=last",
            "train.dtype=float32", f"serve.num_steps={a.num_steps}", *a.overrides]


def load(a, trainer: str):
    from eaglebox.config.load import load_config

    return load_config(a.config, [*settings(a), f"train.output_dir={Path(a.out) / trainer}"])


def plan(cfg) -> dict:
    """The split, the step count and the batches both trainers see, as the training loop derives them."""
    from eaglebox.shards.format import ShardReader
    from eaglebox.train import heldout
    from eaglebox.train.data import batch_indices, steps_per_epoch

    t = cfg.train
    reader = ShardReader(cfg.extract.output_dir)
    train_ids, held_ids = heldout.split(len(reader), t.heldout_share, t.seed)
    per_epoch = steps_per_epoch(len(train_ids), 1, t.batch_size)
    total = min(t.max_steps or per_epoch * t.epochs, per_epoch * t.epochs)
    batches = []
    for step in range(total):
        epoch, in_epoch = divmod(step, per_epoch)
        batches.append([train_ids[i] for i in batch_indices(len(train_ids), t.seed, epoch, in_epoch, 1, 0,
                                                             t.batch_size)])
    return {"reader": reader, "train_ids": train_ids, "held_ids": held_ids, "total": total, "batches": batches}


def budget(cfg, p: dict) -> dict:
    """Tokens the planned batches hold (``valid``) and the answer tokens among them (``loss_mask``)."""
    tokens = answer = 0
    for ids in p["batches"]:
        for i in ids:
            n_ids, mask = p["reader"].ids_and_mask(i)
            n = min(len(n_ids), cfg.train.max_length)
            tokens += n
            answer += int(mask[:n].sum())
    return {"steps": p["total"], "tokens": tokens, "answer_tokens": answer}


# ---------------------------------------------------------------- eaglebox


def _logged(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its output (stdout and stderr) going to ``log`` as it comes, so a run cut short
    leaves its progress behind; the output is returned in ``stdout`` too."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    return subprocess.CompletedProcess(cmd, r.returncode, log.read_text(), "")


def run_eaglebox(a) -> dict:
    cfg = load(a, "eaglebox")
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "eaglebox.cli", "train", "--config", str(a.config), *settings(a),
           f"train.output_dir={Path(a.out) / 'eaglebox'}", "train.checkpoint_every=100000"]
    r = _logged(cmd, Path(a.out) / "eaglebox-train.log")
    if r.returncode:
        raise SystemExit(f"eaglebox train failed ({r.returncode}):\n{r.stdout[-6000:]}")
    out = Path(cfg.train.output_dir)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return {"trainer": "eaglebox", "draft": str(out / "draft"), "wall_s": round(time.monotonic() - t0, 1),
            "final_loss": rows[-1]["loss"], "final_acc_per_position": rows[-1]["acc_per_position"],
            "tokens_per_s": rows[-1].get("tokens_per_s"), "in_loop_last_al": (report.get("last") or {}).get("accept_length"),
            "untrained_al": (report.get("untrained") or {}).get("accept_length")}


# ---------------------------------------------------------------- SpecForge


class _ReferenceLogSoftmaxLoss:
    """SpecForge's own eager reference of its Triton ``LogSoftmaxLoss`` (``core/loss.py``): the same
    loss, -sum(mask * p * log q) over the draft vocabulary, mean over batch x length."""

    @staticmethod
    def apply(logits, target_p, position_mask):
        from specforge.core.loss import _compute_loss

        return _compute_loss(logits, target_p, position_mask)


def specforge_draft(spec, backend: str):
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    if spec.architecture != "llama" or spec.fc_norm or spec.norm_output or spec.num_aux != 3 or spec.rope_scaling:
        raise SystemExit(f"SpecForge's LlamaForCausalLMEagle3 trains a 3-layer, no fc_norm/norm_output, default-RoPE "
                         f"llama draft; this config asks for {spec}")
    lc = LlamaConfig(hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
                     num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
                     intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size, num_hidden_layers=1,
                     max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.rms_norm_eps,
                     rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta}, hidden_act="silu",
                     tie_word_embeddings=False, pad_token_id=None)
    lc.draft_vocab_size = spec.draft_vocab_size
    lc.target_hidden_size = spec.target_hidden_size
    # SpecForge's ``norm_output`` (default True) is whether lm_head reads norm(h): SGLang's norm_output=False
    draft = LlamaForCausalLMEagle3(lc, attention_backend=backend)
    base = draft.midlayer.self_attn.rotary_emb.base
    if not math.isclose(base, spec.rope_theta):
        raise SystemExit(f"SpecForge's draft took rope base {base}, the spec has {spec.rope_theta}")
    return draft


def specforge_weights(model) -> dict:
    """SpecForge's serving state: its checkpoint filter (``Eagle3TrainStrategy.checkpoint_state_filter``:
    ``draft_model.`` stripped, the frozen embedding dropped) then its SGLang key map."""
    from specforge.export.to_sglang import WEIGHT_MAPS

    wmap = WEIGHT_MAPS["LlamaForCausalLMEagle3"]
    state = {k.replace("draft_model.", ""): v.detach().cpu() for k, v in model.state_dict().items()
             if "draft_model." in k and "embed" not in k.lower()}
    return {wmap.get(k, k): v for k, v in state.items()}


def run_specforge(a) -> dict:
    import torch
    from specforge.algorithms.eagle3 import model as sf_model
    from specforge.modeling.target.target_head import TargetHead
    from specforge.optimizer import BF16Optimizer

    from eaglebox.draft.export import check_export, export_draft, provenance, serving_keys
    from eaglebox.draft.spec import draft_spec
    from eaglebox.target.weights import load_embed_and_head
    from eaglebox.train.data import collate
    from eaglebox.train.loop import lr_lambda
    from eaglebox.train.vocab import build_vocab, token_counts

    t0 = time.monotonic()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        sf_model.LogSoftmaxLoss = _ReferenceLogSoftmaxLoss
    cfg = load(a, "specforge")
    t = cfg.train
    torch.manual_seed(t.seed)
    p = plan(cfg)
    reader = p["reader"]
    spec = draft_spec(cfg.model.path, t.draft, num_aux=len(reader.header["layer_ids"]))
    embed, head = load_embed_and_head(Path(cfg.model.path))
    draft = specforge_draft(spec, a.backend)
    d2t, t2d = build_vocab(token_counts(reader, spec.vocab_size), spec.draft_vocab_size)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed.float())
        draft.embed_tokens.weight.requires_grad_(False)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    draft.to(dev)
    model = sf_model.OnlineEagle3Model(draft, length=t.ttt_length, attention_backend=a.backend)
    total = p["total"]
    opt = BF16Optimizer(draft, lr=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
                        total_steps=total, warmup_ratio=min(1.0, t.warmup_steps / total))
    opt.scheduler = torch.optim.lr_scheduler.LambdaLR(opt.optimizer, lr_lambda(t.warmup_steps, total, t.min_lr_ratio))
    head = head.float().to(dev)
    weights = [t.loss_decay**i for i in range(t.ttt_length)]
    tokens = answer = 0
    log = []
    t1 = time.monotonic()
    for step, ids in enumerate(p["batches"]):
        b = {k: v.to(dev) for k, v in collate(reader, ids, t.max_length).items()}
        tokens += int(b["valid"].sum())
        answer += int(b["loss_mask"].sum())
        input_ids, last, loss_mask = TargetHead.preprocess(None, b["input_ids"], b["last"].float(),
                                                           b["loss_mask"].long())
        out = model(input_ids=input_ids, attention_mask=b["valid"].long(), target=None, loss_mask=loss_mask,
                    hidden_states=b["aux"].float(), target_hidden_for_compact=last, target_head_weight=head)
        loss = sum(w * lo for w, lo in zip(weights, out[0]))
        loss.backward()
        grad_norm = opt.step()
        if (step + 1) % t.log_every == 0 or step + 1 == total:
            log.append({"step": step + 1, "loss": float(loss), "grad_norm": float(grad_norm),
                        "lr": opt.scheduler.get_last_lr()[0], "acc_per_position": [float(x) for x in out[2]]})
            print(json.dumps(log[-1]), flush=True)
    loop_s = time.monotonic() - t1
    weights_out = specforge_weights(model)
    want = serving_keys("llama")
    if set(weights_out) != want:
        raise SystemExit(f"SpecForge's serving state differs from SGLang's keys: {sorted(set(weights_out) ^ want)}")
    out_dir = Path(t.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    draft_dir = export_draft(out_dir / "draft", spec, weights_out, provenance(reader, cfg.train.ttt_length))
    check_export(draft_dir)
    return {"trainer": f"specforge {SPECFORGE_VERSION} ({a.backend})", "draft": str(draft_dir),
            "wall_s": round(time.monotonic() - t0, 1), "tokens_per_s": tokens / loop_s, "tokens": tokens,
            "answer_tokens": answer,
            "final_loss": log[-1]["loss"], "final_acc_per_position": log[-1]["acc_per_position"]}


# ---------------------------------------------------------------- evaluation and table


def evaluate(cfg, p: dict, drafts: dict[str, str]) -> tuple[dict, int]:
    """Each draft through the gate's offline evaluator on the same held-out requests (on the GPU if there
    is one, SGLang's CUDA code paths; else on the CPU engine)."""
    import torch

    from eaglebox.draft.offline import evaluate_draft
    from eaglebox.target.weights import load_embed_and_head
    from eaglebox.train import heldout

    samples = heldout.requests(p["reader"], p["held_ids"], cfg.train.max_length, cfg.train.eval_max_samples)
    if not samples:
        raise SystemExit("no held-out sample has a prompt and an answer to score")
    embed, _ = load_embed_and_head(Path(cfg.model.path))
    version = p["reader"].header["engine_version"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {name: evaluate_draft(Path(d), embed.float(), samples, cfg.serve.num_steps, version, device)
            for name, d in drafts.items()}, len(samples)


def table(runs: list[dict], scores: dict, plan_budget: dict, requests: int, num_steps: int) -> str:
    lines = [f"{'trainer':28s} {'steps':>5s} {'tokens':>7s} {'answer':>7s} {'AL':>6s} {'AL/req mean':>11s} "
             f"{'accept rate per position':>26s} {'own loss':>9s} {'train tok/s':>11s}"]
    for r in runs:
        s = scores[r["trainer"]]
        per_req = s["accept_length_per_request"]
        pos = ", ".join("-" if x is None else f"{x:.3f}" for x in s["accept_rate_per_position"])
        lines.append(f"{r['trainer']:28s} {plan_budget['steps']:5d} {r['tokens']:7d} {r['answer_tokens']:7d} "
                     f"{s['accept_length']:6.3f} {sum(per_req) / len(per_req):11.3f} {pos:>26s} "
                     f"{r['final_loss']:9.4f} {r['tokens_per_s']:11.0f}")
    ours, theirs = (scores[r["trainer"]] for r in runs[:2])
    lines.append(f"eaglebox / SpecForge AL: {ours['accept_length'] / theirs['accept_length']:.3f} (summary AL = "
                 f"completion tokens / verify cycles over {requests} held-out requests, chain of {num_steps}); "
                 f"per-request mean: {_mean(ours) / _mean(theirs):.3f}")
    lines.append(f"untrained draft (eaglebox's step-0 evaluation, same requests): AL {runs[0]['untrained_al']:.3f}; "
                 f"eaglebox's in-loop AL of its last step: {runs[0]['in_loop_last_al']:.3f}")
    lines.append("tokens: positions trained on (both trainers, the same batches); answer: loss-masked among them. "
                 "own loss: each trainer's logged objective at the last step (not comparable: eaglebox divides by "
                 "scored positions, SpecForge by batch x length). train tok/s: the training steps alone (not "
                 "a throughput benchmark, see train_throughput.py)")
    return "\n".join(lines)


def _mean(s: dict) -> float:
    return sum(s["accept_length_per_request"]) / len(s["accept_length_per_request"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny-cpu.yaml")
    ap.add_argument("--shards", type=Path, required=True, help="shards made by `eaglebox extract` with --config")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "train-quality")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--ttt", type=int, default=4, help="train.ttt_length = SpecForge's OnlineEagle3Model length")
    ap.add_argument("--max-length", type=int, default=320)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-share", type=float, default=0.15)
    ap.add_argument("--eval-samples", type=int, default=12)
    ap.add_argument("--num-steps", type=int, default=3, help="serve.num_steps: the evaluator's chain length")
    ap.add_argument("--backend", default="sdpa", help="SpecForge attention backend (sdpa on CPU)")
    ap.add_argument("--result", type=Path, help="also write the table and the JSON here")
    ap.add_argument("--one", choices=["specforge"], help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value) for both trainers")
    a = ap.parse_args()
    a.shards, a.out = a.shards.resolve(), a.out.resolve()
    if a.one:
        print("RESULT " + json.dumps(run_specforge(a)), flush=True)
        return
    cfg = load(a, "eaglebox")
    p = plan(cfg)
    b = budget(cfg, p)
    eb = {**run_eaglebox(a), **{k: b[k] for k in ("tokens", "answer_tokens")}}
    env = {**os.environ, "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE", "1")}
    cmd = [sys.executable, __file__, "--one", "specforge", *sys.argv[1:]]
    r = _logged(cmd, a.out / "specforge-train.log", env)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not line:
        raise SystemExit(f"SpecForge run failed ({r.returncode}):\n{r.stdout[-6000:]}")
    sf = json.loads(line[-1][7:])
    if (sf["tokens"], sf["answer_tokens"]) != (b["tokens"], b["answer_tokens"]):
        raise SystemExit(f"the trainers saw different data: SpecForge {sf['tokens']}/{sf['answer_tokens']} tokens, "
                         f"the plan {b['tokens']}/{b['answer_tokens']}")
    runs = [eb, sf]
    scores, requests = evaluate(cfg, p, {x["trainer"]: x["draft"] for x in runs})
    text = table(runs, scores, b, requests, cfg.serve.num_steps)
    import torch

    t = cfg.train
    cmd_line = " ".join(["python", "benchmarks/train_quality.py", *sys.argv[1:]])
    head = (f"# command: {cmd_line}\n# benchmarks/train_quality.py: {len(p['reader'])} samples in {a.shards.name} "
            f"({len(p['train_ids'])} trained on, {len(p['held_ids'])} held out; {requests} scored), target "
            f"{cfg.model.path} (weights {p['reader'].header['target'].get('weights_digest', '?')[:12]}); {b['steps']} steps x batch {t.batch_size}, max_length {t.max_length}, TTT "
            f"{t.ttt_length}, lr {t.lr} (warmup {t.warmup_steps}, cosine to {t.min_lr_ratio}), clip "
            f"{t.max_grad_norm}, loss decay {t.loss_decay}, seed {t.seed}, fp32; draft vocab "
            f"{t.draft.draft_vocab_size}\n# machine: {platform.machine()} {os.cpu_count()} CPUs "
            f"({platform.processor() or platform.platform()}), torch "
            f"{torch.__version__}, {'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}; "
            f"SpecForge {SPECFORGE_VERSION}")
    print(head + "\n" + text)
    result = {"budget": b, "requests": requests, "runs": runs, "scores": scores,
              "al_ratio": scores["eaglebox"]["accept_length"] / scores[sf["trainer"]]["accept_length"]}
    (a.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if a.result:
        a.result.write_text(head + "\n" + text + "\n\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
