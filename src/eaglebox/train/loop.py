"""The training run: shards -> EAGLE-3 draft, DDP or FSDP2 over ``torchrun`` ranks (gloo on CPU, NCCL on GPU).

Rerunning the same command resumes from the newest complete checkpoint: weights, optimizer, LR
schedule, RNG, data position. Metrics go to ``metrics.jsonl`` (lines past the resumed step are
dropped, so an interrupted-then-resumed curve equals an uninterrupted one); the end writes
``curves.png`` and exports the SGLang draft to ``output_dir/draft``. With ``train.heldout_share`` the
trainer scores held-out samples with the gate's evaluator during the run and exports the best draft
(:mod:`eaglebox.train.heldout`). ``report.json`` records the loss (``train.loss``: what ``loss`` in
``metrics.jsonl`` is), the TTT attention kernel chosen for each GPU and, with a held-out split, the
evaluations.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from eaglebox import progress
from eaglebox.draft.export import export_draft, provenance
from eaglebox.draft.spec import draft_spec
from eaglebox.errors import EagleboxError
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.format import ShardReader
from eaglebox.shards.spec import NOT_INSTALLED
from eaglebox.target.fingerprint import stale
from eaglebox.target.weights import load_embed_and_head
from eaglebox.train import checkpoint, heldout
from eaglebox.train.data import batch_indices, collate, prefetch, steps_per_epoch
from eaglebox.train.dist import Dist
from eaglebox.train.kernel_check import check_kernels
from eaglebox.train.model import PAD_MULTIPLE, Eagle3Draft
from eaglebox.train.step import make_optimizer, make_step
from eaglebox.train.ttt import attention_choices
from eaglebox.train.vocab import draft_vocab


def check_header(recorded: CaptureSpec, expected: CaptureSpec, where: Path) -> None:
    """Refuse shards captured otherwise than this config says, naming every difference and both values."""
    if expected.engine_version == NOT_INSTALLED:
        raise EagleboxError(f"{where}: shards were captured with SGLang {recorded.engine_version}, and SGLang is "
                            "not installed here, so they cannot be checked against the engine that will serve the "
                            "draft; train where that SGLang is installed (the eaglebox image)")
    if (why := stale(recorded.target.model_dump())) is not None:
        raise EagleboxError(f"{where}: the shards' target fingerprint was {why}; extract them again (into another "
                            "extract.output_dir) and train on those")
    if diffs := recorded.diff(expected):
        raise EagleboxError(f"{where}: shards have " + "; ".join(f"{k}={have!r}, the config implies {want!r}"
                                                                  for k, (have, want) in diffs.items()) +
                            "; re-extract or fix the config")


DATA_PROVENANCE = "data-provenance.json"
"""An online or hybrid run's draft provenance (:func:`~eaglebox.draft.export.provenance` of its samples), for
``eaglebox export``."""


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def run_train(cfg, expected: CaptureSpec, log=print, reader=None) -> Path:
    """``reader``: where the samples come from, with :class:`ShardReader`'s interface (``len``, ``get``,
    ``ids_and_mask``, ``capture``, ``digest``, ``report``); None reads the shards of ``extract.output_dir``.
    ``eaglebox train`` passes the online reader for ``train.data: online | hybrid``."""
    t = cfg.train
    d = Dist()
    torch.manual_seed(t.seed)
    out = Path(t.output_dir)
    reader = reader if reader is not None else ShardReader(cfg.extract.output_dir)
    check_header(reader.capture, expected, Path(cfg.extract.output_dir))
    spec, model, embed, head = build_draft(cfg, reader, d)
    ddp = parallelize(model, t.parallel, d.world)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, t.lr, t.weight_decay)
    train_ids, held_ids = heldout.split(len(reader), t.heldout_share, t.seed)
    per_epoch, total = plan_steps(len(train_ids), d.world, t)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup_steps, total, t.min_lr_ratio))
    ckpt_dir = out / "checkpoints"
    if d.rank == 0:
        need, free = checkpoint.check_room(ckpt_dir, model, t.keep_checkpoints)
        log(f"train: checkpoints and drafts need ~{need / 1e9:.2f} GB, {free / 1e9:.1f} GB free at {ckpt_dir}")
    step = 0
    resume = checkpoint.latest(ckpt_dir)
    order = data_order(reader, t)
    if resume is not None:
        step = checkpoint.load(resume, model, optimizer, scheduler, d.rank, d.world, order)["step"]
        if d.rank == 0:
            log(f"train: resumed from {resume} (step {step}/{total})")
    metrics_path = out / "metrics.jsonl"
    if d.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        _truncate_metrics(metrics_path, step)
        if t.data != "offline":  # `eaglebox export` has no shards to read it from
            (out / DATA_PROVENANCE).write_text(json.dumps(provenance(reader, t.ttt_length), indent=1) + "\n")
    evaluator = make_evaluator(cfg, reader, spec, embed, held_ids, step, d, log) if held_ids and d.rank == 0 else None

    def evaluate(at: int) -> None:
        w = checkpoint.trainable_state(model)  # collective under FSDP
        if evaluator is not None:
            evaluator(at, w)
        d.barrier()

    if held_ids and step == 0:
        evaluate(0)
    weights = torch.tensor([t.loss_decay**i for i in range(t.ttt_length)], device=d.device)
    graphs = t.cuda_graphs and d.device.type == "cuda" and d.world == 1
    step_fn = make_step(ddp, optimizer, params, head, weights, t.max_grad_norm, d,
                        bf16=d.device.type == "cuda" and t.dtype == "bfloat16", graphs=graphs)
    if d.rank == 0:
        log(f"train: {'CUDA graphs, one per batch shape' if graphs else 'eager steps'} on {d.world} x {d.device.type}; "
            f"loss {t.loss}")
    bar = progress.bar(total=total, initial=step, desc="train", unit="step", disable=d.rank != 0)
    tokens_seen, t0 = torch.zeros((), dtype=torch.int64, device=d.device), time.monotonic()
    pad = PAD_MULTIPLE if d.device.type == "cuda" else 1
    positions = (divmod(s, per_epoch) for s in range(step, total))
    batches = prefetch(lambda at: collate(reader, [train_ids[i] for i in batch_indices(
        len(train_ids), t.seed, *at, d.world, d.rank, t.batch_size)], t.max_length, pad), positions, t.loader_threads)
    for (epoch, in_epoch), batch in batches:
        batch = {k: v.to(d.device, non_blocking=True) for k, v in batch.items()}
        grad_norm, stats = step_fn(batch)
        scheduler.step()
        step += 1
        tokens_seen += batch["valid"].sum()
        logged = step % t.log_every == 0 or step == total
        if logged:  # collectives on every rank; the loop's only host sync
            stats = d.sum(stats).cpu()
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: DTensor
        if d.rank == 0 and logged:
            elapsed = time.monotonic() - t0  # in each row: a steady rate between two rows, past the warm-up
            row = {"step": step, "epoch": epoch, "lr": float(scheduler.get_last_lr()[0]), "grad_norm": float(grad_norm),
                   **step_stats(stats, weights), "tokens_per_s": int(tokens_seen) * d.world / elapsed,
                   "elapsed_s": round(elapsed, 3)}
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_per_position'][0]:.2f}",
                            tok_s=f"{row['tokens_per_s']:.0f}")
        bar.update(1)
        if held_ids and ((t.eval_every and step % t.eval_every == 0) or step == total):
            evaluate(step)
        if step % t.checkpoint_every == 0 or step == total:
            checkpoint.save(ckpt_dir, step, model, optimizer, scheduler,
                            {"epoch": epoch, "step_in_epoch": in_epoch + 1}, d.rank, d.world, d.barrier,
                            t.keep_checkpoints, order)
    bar.close()
    weights_out = checkpoint.trainable_state(model)  # collective under FSDP
    if d.rank == 0:
        publish(cfg, reader, spec, weights_out, evaluator, total, len(train_ids), len(held_ids), log)
    d.barrier()
    return out / "draft"


def plan_steps(n_train: int, world: int, t) -> tuple[int, int]:
    """Steps an epoch and in all (``train.max_steps`` caps ``train.epochs``)."""
    per_epoch = steps_per_epoch(n_train, world, t.batch_size)
    if per_epoch == 0:
        raise EagleboxError(f"{n_train} training samples are fewer than one step ({world} ranks x batch {t.batch_size})")
    return per_epoch, min(t.max_steps or per_epoch * t.epochs, per_epoch * t.epochs)


def data_order(reader: ShardReader, t) -> dict:
    """What fixes the order of batches: a checkpoint resumes only where it is the same."""
    order = {"shards": reader.digest(), "batch_size": t.batch_size, "max_length": t.max_length,
             "seed": t.seed}
    if t.heldout_share:  # only then: checkpoints of runs without a held-out split stay resumable
        order["heldout_share"] = t.heldout_share
    return order


def build_draft(cfg, reader: ShardReader, d: Dist):
    """The draft at step 0 on ``d``'s device: the target's frozen embedding, the draft vocabulary counted
    over the shards (collective), compiled steps on a GPU, measured against the eager ones (kernel_check);
    with the target's lm_head there too."""
    t = cfg.train
    spec = draft_spec(cfg.model.path, t.draft, num_aux=len(reader.capture.layers.layer_ids))
    model = Eagle3Draft(spec, loss=t.loss)
    embed, head = load_embed_and_head(Path(cfg.model.path))
    model.embed_tokens.to(embed.dtype)  # frozen: kept in the target's dtype, as SGLang serves it
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        d2t, t2d = draft_vocab(reader, spec.vocab_size, spec.draft_vocab_size, d)  # collective
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    model.to(d.device)
    if d.device.type == "cuda":
        model.compile_steps(t.max_length)
        check_kernels(model, t.ttt_length, d.device)
    return spec, model, embed, head.to(d.device)


def make_evaluator(cfg, reader: ShardReader, spec, embed, held_ids: list[int], step: int, d: Dist, log):
    """Rank 0's held-out evaluator (SGLang's draft class on the held-out samples), resumed at ``step``."""
    t = cfg.train
    samples = heldout.requests(reader, held_ids, t.max_length, t.eval_max_samples)
    if not samples:
        raise EagleboxError(f"none of the {len(held_ids)} held-out samples has a prompt and an answer to score")
    prov = provenance(reader, cfg.train.ttt_length)
    evaluator = heldout.Evaluator(Path(t.output_dir), lambda where, w: export_draft(where, spec, w, prov), embed,
                                  samples, cfg.serve.num_steps, reader.capture.engine_version, isolated=d.world > 1,
                                  device=str(d.device), log=log)
    evaluator.resume(step)
    log(f"train: {len(held_ids)} of {len(reader)} samples held out; {len(samples)} scored per evaluation "
        f"(chain of {cfg.serve.num_steps}, SGLang's draft class)")
    return evaluator


def step_stats(stats: torch.Tensor, weights: torch.Tensor) -> dict:
    """Loss (weighted over TTT positions), loss and accuracy per position, from the summed step stats."""
    return {"loss": float((weights.cpu() * stats[0]).sum() / stats[2][0].clamp_min(1)),
            "loss_per_position": (stats[0] / stats[2].clamp_min(1)).tolist(),
            "acc_per_position": (stats[1] / stats[2].clamp_min(1)).tolist()}


def publish(cfg, reader: ShardReader, spec, weights: dict, evaluator, total: int, n_train: int, n_held: int,
            log) -> None:
    """Rank 0, after the last step: the draft exported (the best held-out one when evaluating), the
    report and the curves."""
    from eaglebox.train.plots import plot_metrics

    out = Path(cfg.train.output_dir)
    draft_dir = out / "draft"
    # the TTT attention kernel chosen per GPU from its shared memory (SM120: small flex blocks)
    report = {"steps": total, "loss": cfg.train.loss, "data": reader.report(),
              "attention": attention_choices() or {"cpu": "eager dense reference"}}
    if evaluator is None:
        export_draft(draft_dir, spec, weights, provenance(reader, cfg.train.ttt_length))
    else:
        report |= {"train_samples": n_train, "heldout_samples": n_held,
                   **evaluator.finish(draft_dir, weights, cfg.train.export)}
        b, u = report["best"], report["untrained"]
        log(f"train: exported the {report['exported']} draft (step {report['exported_step']}); held-out AL best "
            f"{b['accept_length'] if b else float('nan'):.3f}, last {report['last']['accept_length']:.3f}"
            + (f", untrained {u['accept_length']:.3f}" if u else "") + f"; report {out / 'report.json'}")
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_metrics(out / "metrics.jsonl", out / "curves.png", evals=out / heldout.EVALS)
    log(f"train: exported {draft_dir}; curves {out / 'curves.png'}")


def parallelize(model: Eagle3Draft, how: str, world: int) -> torch.nn.Module:
    """DDP replicates the draft on every rank. FSDP2 shards its weights, gradients and optimizer
    state across ranks (for wide drafts: Kimi-K2.5's is about 1B parameters, 16 GB of fp32 weights
    and Adam state) and keeps the frozen target embedding whole on each."""
    if world == 1:
        return model
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        return fully_shard(model, ignored_params={model.embed_tokens.weight})
    return torch.nn.parallel.DistributedDataParallel(model)


def _truncate_metrics(path: Path, step: int) -> None:
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))
