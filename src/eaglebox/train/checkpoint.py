"""Complete, atomic checkpoints: a rerun of the same command resumes where the last one ended.

``checkpoints/step-NNNNNNNN/`` holds the trainable weights (safetensors), the optimizer and LR
schedule, every rank's RNG states, the data position (epoch, step in epoch) and the global step.
It is written as a hidden temporary directory and renamed into place, so a directory with the
final name is always complete; the oldest are pruned to ``keep``. Weights and optimizer state go
through ``torch.distributed.checkpoint.state_dict`` as full (unsharded) tensors, so DDP and FSDP2
runs write the same files.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from eaglebox.errors import EagleboxError

PREFIX = "step-"
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def trainable_names(model: torch.nn.Module) -> set[str]:
    return {k for k, v in model.named_parameters() if v.requires_grad} | {"d2t", "t2d"}


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights the optimizer changes, plus the vocabulary maps; not the frozen target embedding.
    Collective under FSDP2: every rank calls it, rank 0 gets the full tensors (others nothing)."""
    keep = trainable_names(model)
    return {k: v.contiguous() for k, v in get_model_state_dict(model, options=FULL).items() if k in keep}


def run_bytes(model: torch.nn.Module, keep: int, present: int = 0) -> tuple[int, int]:
    """Disk a run still needs for its checkpoints and its drafts, and one checkpoint's size: ``keep``
    checkpoints plus the one being written, less the ``present`` ones already there, each the trainable
    weights and AdamW's two moments as stored (fp32), plus two exported drafts (the held-out evaluation's
    and the final one) in bf16. An estimate: a run that fills the disk at its last checkpoint loses its
    draft, so ``eaglebox train`` checks it before the first step. Works on a ``meta`` model."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    one = 3 * 4 * numel
    return max(0, keep + 1 - present) * one + 2 * 2 * numel, one


def check_room(ckpt_dir: Path, model: torch.nn.Module, keep: int) -> tuple[int, int]:
    """Refuse to start a run whose checkpoints and drafts (:func:`run_bytes`) do not fit the free disk;
    return the bytes it needs and the bytes free."""
    ckpt_dir = Path(ckpt_dir)
    need, one = run_bytes(model, keep, len(complete(ckpt_dir)))
    probe = next(p for p in (ckpt_dir, *ckpt_dir.parents) if p.exists())
    free = shutil.disk_usage(probe).free
    if free < need:
        raise EagleboxError(f"{ckpt_dir}: {free / 1e9:.1f} GB free, and this run needs ~{need / 1e9:.1f} GB for "
                            f"its checkpoints (train.keep_checkpoints={keep}, plus the one being written, "
                            f"{one / 1e9:.1f} GB each) and exported drafts. Free space there, lower "
                            "train.keep_checkpoints, or point train.output_dir at another disk")
    return need, free


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


def complete(ckpt_dir: Path) -> list[Path]:
    """The complete checkpoints in ``ckpt_dir``, oldest first (a temporary one's name is hidden)."""
    return sorted(p for p in Path(ckpt_dir).glob(f"{PREFIX}*") if p.is_dir())


def latest(ckpt_dir: Path) -> Path | None:
    found = complete(ckpt_dir)
    return found[-1] if found else None


def save(ckpt_dir: Path, step: int, model, optimizer, scheduler, position: dict, rank: int, world: int,
         barrier, keep: int, extra: dict) -> Path:
    """Collective: every rank gathers the state and writes its RNG file into the temporary
    directory, rank 0 the rest."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"{PREFIX}{step:08d}"
    tmp = ckpt_dir / f".{final.name}.tmp"
    weights = trainable_state(model)
    optim = get_optimizer_state_dict(model, optimizer, options=FULL)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    try:
        torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")
        if rank == 0:
            save_file(weights, tmp / "model.safetensors")
            torch.save({"optimizer": optim, "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
            (tmp / "state.json").write_text(json.dumps({"step": step, "world": world, **position, **extra}, indent=1))
    except (OSError, RuntimeError, SafetensorError) as err:  # e.g. a full disk (safetensors, torch.save)
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(ckpt_dir).free
        raise EagleboxError(f"{final}: the checkpoint could not be written ({err}); {free / 1e9:.1f} GB free "
                            f"there. The last complete checkpoint is kept: free space, then run the same "
                            "command to resume") from err
    barrier()
    if rank == 0:
        tmp.rename(final)
        for old in complete(ckpt_dir)[:-keep]:
            shutil.rmtree(old)
    barrier()
    return final


def check_resumable(path: Path, state: dict, world: int, data: dict) -> None:
    """Refuse to resume a run whose data order would differ: the step's samples depend on the shards,
    the global batch (ranks x batch size), the sequence length and the seed."""
    if state["world"] != world:
        raise EagleboxError(f"{path} was written by {state['world']} ranks; resume with the same number "
                            f"(torchrun --nproc-per-node {state['world']}) or start a new train.output_dir")
    diffs = [f"{k}: checkpoint {state.get(k)!r}, now {v!r}" for k, v in data.items() if state.get(k) != v]
    if diffs:
        raise EagleboxError(f"{path} cannot be resumed with this config and data; it would train on another "
                            "sample order:\n  " + "\n  ".join(diffs) +
                            "\n(restore the shards and settings it was written with, or start a new train.output_dir)")


def load(path: Path, model, optimizer, scheduler, rank: int, world: int, data: dict) -> dict:
    """Every rank reads the full files; FSDP2 keeps its own shard of them. ``data`` (what the data
    order depends on) must equal what the checkpoint recorded."""
    state = json.loads((path / "state.json").read_text())
    check_resumable(path, state, world, data)
    weights = load_file(path / "model.safetensors")
    expected = trainable_names(model)
    if set(weights) != expected:
        raise RuntimeError(f"{path}: holds {sorted(set(weights) ^ expected)} that the model does not match")
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    opt = torch.load(path / "optim.pt", weights_only=False)
    set_optimizer_state_dict(model, optimizer, opt["optimizer"], options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(torch.load(path / f"rng-rank{rank}.pt", weights_only=False))
    return state
