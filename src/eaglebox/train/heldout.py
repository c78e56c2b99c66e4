"""Held-out samples and simulated acceptance during training; the best draft is the one exported.

``train.heldout_share`` of the shards' samples (a seeded choice, fixed for the run) are never trained
on. Every ``train.eval_every`` steps and at the last step the trainer exports the current weights as
an SGLang draft directory and scores it with the acceptance gate's own evaluator
(:func:`eaglebox.draft.offline.evaluate_draft`: SGLang's ``LlamaForCausalLMEagle3`` loaded by SGLang's
weight loader, chain drafting of ``serve.num_steps`` tokens, greedy verification) on up to
``train.eval_max_samples`` held-out samples. A held-out sample is the gate's kind of request: its
prompt is the tokens before the first answer token, its continuation the answer (the target's own
greedy answer when the shards were extracted with ``extract.regenerate``) and its features the
captured ones. The step-0 draft (untrained weights) is scored too, as a control; it is never a
candidate for best.

Files in ``train.output_dir``: ``evals.jsonl`` (one row per evaluation), ``draft-best/`` (the best
evaluation's export, with ``eaglebox-eval.json``), and at the end ``draft-last/`` and ``draft/`` (a
copy of the best, or of the last with ``train.export: last``).

Multi-rank runs: SGLang's draft class needs its own world-1 process group and model-parallel state,
which cannot coexist with the trainer's ``torchrun`` group in one process, so rank 0 evaluates in a
spawned child process (same function, same evaluator); world-1 runs evaluate in process.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from eaglebox.draft.export import replace_dir
from eaglebox.errors import EagleboxError

EVALS = "evals.jsonl"
BEST = "draft-best"
LAST = "draft-last"
STAMP = "eaglebox-eval.json"


def split(n: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """(train ids, held-out ids), both sorted: ``round(n * share)`` samples (at least 1 for a share > 0)
    chosen by a seeded permutation."""
    if share <= 0:
        return list(range(n)), []
    k = max(1, round(n * share))
    if k >= n:
        raise EagleboxError(f"train.heldout_share={share} holds out all {n} samples")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + 17)).tolist()
    return sorted(perm[k:]), sorted(perm[:k])


def request(sample: dict) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(seq, aux features, prompt_len) for the offline evaluator from one shard sample: the tokens up to
    the end of its first answer (the first run of loss-masked tokens); None without an answer of 2+
    tokens after a prompt."""
    mask = sample["loss_mask"].bool()
    idx = mask.nonzero().flatten()
    if len(idx) == 0 or idx[0] == 0:
        return None
    start = int(idx[0])
    gaps = (~mask[start:]).nonzero().flatten()
    end = start + int(gaps[0]) if len(gaps) else len(mask)
    if end - start < 2:
        return None
    return sample["input_ids"][:end].clone(), sample["aux"][:end].float(), start


def requests(reader, ids: list[int], max_length: int, limit: int) -> list:
    out = []
    for i in ids:
        r = request(reader.get(i, max_rows=max_length))
        if r is not None:
            out.append(r)
        if len(out) == limit:
            break
    return out


def _evaluate(draft_dir: Path, embed: torch.Tensor, samples, num_steps: int, engine_version: str,
              device: str = "cpu") -> dict:
    from eaglebox.draft.offline import evaluate_draft

    # SGLang's draft class initialises weights: keep the run's RNG (the GPU's too when it runs there)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device.startswith("cuda") else []):
        return evaluate_draft(draft_dir, embed, samples, num_steps, engine_version, device)


def _child(env: dict, args_path: str, q) -> None:
    import os

    from eaglebox.engine.server import without_torchrun

    kept = without_torchrun(os.environ)
    os.environ.clear()
    os.environ.update({**kept, **env})
    try:
        q.put(("ok", _evaluate(*torch.load(args_path, weights_only=False))))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        q.put(("error", repr(err)))


def evaluate_isolated(draft_dir: Path, *rest) -> dict:
    """:func:`_evaluate` in a spawned process (multi-rank runs; see the module docstring). The arguments
    travel as a file beside the draft, not through the pipe."""
    import multiprocessing as mp
    import queue

    args_path = Path(draft_dir) / "eval-args.pt"
    torch.save((Path(draft_dir), *rest), args_path)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=({"SGLANG_USE_CPU_ENGINE": "1"}, str(args_path), q), daemon=True)
    p.start()
    while True:
        try:
            status, value = q.get(timeout=5)
            break
        except queue.Empty:
            if not p.is_alive():
                raise EagleboxError(f"held-out evaluation process exited with code {p.exitcode}") from None
    p.join()
    args_path.unlink()
    if status != "ok":
        raise EagleboxError(f"held-out evaluation failed: {value}")
    return value


class Evaluator:
    """Rank 0's evaluations of one run: scores, ``evals.jsonl`` and the best export."""

    def __init__(self, out: Path, export, embed: torch.Tensor, samples: list, num_steps: int, engine_version: str,
                 isolated: bool, device: str = "cpu", log=print):
        """``isolated``: each evaluation in a spawned CPU process (multi-rank runs); otherwise in this
        process on ``device`` (the trainer's)."""
        self.out, self.export, self.samples, self.device = Path(out), export, samples, device
        self.embed, self.num_steps, self.engine_version = embed.float().cpu(), num_steps, engine_version
        self.isolated, self.log = isolated, log
        self.path = self.out / EVALS
        self.best: dict | None = None

    def resume(self, step: int) -> None:
        """Keep the rows up to ``step`` and the best among them, if ``draft-best`` still holds it."""
        rows = []
        if self.path.exists():
            rows = [json.loads(x) for x in self.path.read_text().splitlines() if x]
            rows = [r for r in rows if r["step"] <= step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cands = [r for r in rows if r["step"] > 0]
        best = max(cands, key=lambda r: (r["accept_length"], -r["step"])) if cands else None
        stamp = self.out / BEST / STAMP
        if best is not None and stamp.exists() and json.loads(stamp.read_text())["step"] == best["step"]:
            self.best = best
        elif best is not None:
            self.log(f"train: {self.out / BEST} does not hold the best evaluation (step {best['step']}); "
                     "best is chosen again from the evaluations after this point")

    def __call__(self, step: int, weights: dict) -> dict:
        t0 = time.monotonic()
        tmp = self.out / ".eval-draft"
        shutil.rmtree(tmp, ignore_errors=True)
        self.export(tmp, weights)
        args = (tmp, self.embed, self.samples, self.num_steps, self.engine_version)
        r = evaluate_isolated(*args) if self.isolated else _evaluate(*args, self.device)
        row = {"step": step, "accept_length": r["accept_length"],
               "accept_rate_per_position": r["accept_rate_per_position"], "requests": r["requests"],
               "completion_tokens": r["completion_tokens"], "num_steps": self.num_steps,
               "eval_s": round(time.monotonic() - t0, 2)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        better = step > 0 and (self.best is None or row["accept_length"] > self.best["accept_length"])
        if better:
            (tmp / STAMP).write_text(json.dumps(row, indent=1) + "\n")
            replace_dir(tmp, self.out / BEST)
            self.best = row
        else:
            shutil.rmtree(tmp)
        what = "untrained control" if step == 0 else ("new best" if better else f"best {self.best['accept_length']:.3f}"
                                                       f" at step {self.best['step']}")
        self.log(f"train: step {step} held-out AL {row['accept_length']:.3f} over {row['requests']} requests "
                 f"(accept rate per position {row['accept_rate_per_position']}; {what}; {row['eval_s']:.1f} s)")
        return row

    def finish(self, draft_dir: Path, last_weights: dict, which: str) -> dict:
        """Export the last weights to ``draft-last`` and the chosen one (best, or last) to ``draft_dir``;
        returns the run report's evaluation part."""
        last = self.out / LAST
        shutil.rmtree(last, ignore_errors=True)
        self.export(last, last_weights)
        chosen = "best" if which == "best" and self.best is not None else "last"
        src = self.out / BEST if chosen == "best" else last
        tmp = draft_dir.with_name(draft_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        (tmp / STAMP).unlink(missing_ok=True)
        replace_dir(tmp, draft_dir)
        rows = [json.loads(x) for x in self.path.read_text().splitlines() if x] if self.path.exists() else []
        return {"heldout_requests": len(self.samples), "num_steps": self.num_steps, "evals": rows,
                "untrained": next((r for r in rows if r["step"] == 0), None), "best": self.best,
                "last": rows[-1] if rows else None, "exported": chosen,
                "exported_step": (self.best if chosen == "best" else rows[-1] if rows else {}).get("step")}
