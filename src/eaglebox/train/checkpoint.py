"""Complete, atomic checkpoints: a rerun of the same command resumes where the last one ended.

``checkpoints/step-NNNNNNNN/`` holds the trainable weights (safetensors), the optimizer and LR
schedule, every rank's RNG states, the data position (epoch, step in epoch) and the global step.
It is written as a hidden temporary directory and renamed into place, so a directory with the
final name is always complete; the oldest are pruned to ``keep``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PREFIX = "step-"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights the optimizer changes, plus the vocabulary maps; not the frozen target embedding."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.named_parameters() if v.requires_grad}
    state.update({"d2t": model.d2t.cpu(), "t2d": model.t2d.cpu()})
    return state


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def latest(ckpt_dir: Path) -> Path | None:
    found = sorted(p for p in Path(ckpt_dir).glob(f"{PREFIX}*") if p.is_dir())
    return found[-1] if found else None


def save(ckpt_dir: Path, step: int, model, optimizer, scheduler, position: dict, rank: int, world: int,
         barrier, keep: int, extra: dict) -> Path:
    """Collective: every rank writes its RNG file into the temporary directory, rank 0 the rest."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"{PREFIX}{step:08d}"
    tmp = ckpt_dir / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")
    if rank == 0:
        save_file(trainable_state(model), tmp / "model.safetensors")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, "world": world, **position, **extra}, indent=1))
    barrier()
    if rank == 0:
        tmp.rename(final)
        for old in sorted(p for p in ckpt_dir.glob(f"{PREFIX}*") if p.is_dir())[:-keep]:
            shutil.rmtree(old)
    barrier()
    return final


def load(path: Path, model, optimizer, scheduler, rank: int, world: int) -> dict:
    state = json.loads((path / "state.json").read_text())
    if state["world"] != world:
        raise RuntimeError(f"{path} was written by {state['world']} ranks; resume with the same number "
                           f"(torchrun --nproc-per-node {state['world']}) or start a new train.output_dir")
    weights = load_file(path / "model.safetensors")
    expected = set(trainable_state(model))
    if set(weights) != expected:
        raise RuntimeError(f"{path}: holds {sorted(set(weights) ^ expected)} that the model does not match")
    model.load_state_dict(weights, strict=False)
    opt = torch.load(path / "optim.pt", weights_only=False)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(torch.load(path / f"rng-rank{rank}.pt", weights_only=False))
    return state
