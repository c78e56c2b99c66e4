"""A model directory's safetensors weights, read whole and written shard by shard: the padded targets of
the GPU checks (:mod:`eaglebox_dev.kimi_width`, ``tools/h200/checks/served.py``) are 16 GB and more, so
their tensors are made one at a time and written as transformers and SGLang read a sharded checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch


def read_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


def write_shards(out: Path, tensors: Iterable[tuple[str, torch.Tensor]], shard_bytes: int = 4 << 30) -> None:
    """``tensors`` into ``out`` as ``model-0000N.safetensors`` of about ``shard_bytes`` each (a shard is
    written once it passes that) and ``model.safetensors.index.json``; at most one shard is held at a time."""
    from safetensors.torch import save_file

    shards, weight_map, shard, held = [], {}, {}, 0

    def flush() -> None:
        nonlocal held
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, out / name, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
            shards.append(name)
            shard.clear()
            held = 0

    for key, t in tensors:
        shard[key] = t.contiguous()
        held += t.numel() * t.element_size()
        if held > shard_bytes:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum((out / s).stat().st_size for s in shards)}, "weight_map": weight_map}, indent=1))
