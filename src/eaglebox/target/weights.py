"""The target's embedding and lm_head, which the draft shares (frozen) and trains against.

Only the two tensors are read (through the safetensors index), never the whole checkpoint: a
1T-parameter target's embedding and head are a few GB, its experts are not touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from eaglebox.errors import EagleboxError


def _weight_files(model_path: Path) -> dict[str, Path]:
    index = model_path / "model.safetensors.index.json"
    if index.exists():
        return {k: model_path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    files = sorted(model_path.glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            out.update({k: f for k in st.keys()})
    return out


def _find(files: dict[str, Path], suffix: str) -> str | None:
    hits = sorted(k for k in files if k.endswith(suffix) and "mtp" not in k)
    return hits[0] if hits else None


def _load(files: dict[str, Path], key: str) -> torch.Tensor:
    with safe_open(str(files[key]), "pt") as st:
        return st.get_tensor(key)


def load_embedding(model_path: Path, files: dict[str, Path] | None = None) -> torch.Tensor:
    """The target's ``embed_tokens.weight``."""
    files = files or _weight_files(Path(model_path))
    key = _find(files, "embed_tokens.weight")
    if key is None:
        raise EagleboxError(f"{model_path}: no embed_tokens.weight in the checkpoint")
    return _load(files, key)


def load_embed_and_head(model_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens.weight, lm_head.weight) of the target; a tied head is the embedding."""
    files = _weight_files(Path(model_path))
    embed = load_embedding(model_path, files)
    head_key = _find(files, "lm_head.weight")
    return embed, _load(files, head_key) if head_key else embed
