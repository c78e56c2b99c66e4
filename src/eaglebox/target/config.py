"""The target's ``config.json``: the language model's shape, its dtype, the digest that names it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def read_target_config(model_path: Path) -> dict:
    path = Path(model_path) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise FileNotFoundError(f"model.path: cannot read {path} ({err.strerror})") from err


def text_config(model_path: Path) -> dict:
    """The language model's part of the target config (VLM wrappers such as Kimi-K2.5 nest it)."""
    hf = read_target_config(model_path)
    return hf.get("text_config", hf)


def num_layers(model_path: Path) -> int:
    return int(text_config(model_path)["num_hidden_layers"])


def target_dtype(model_path: Path, dtype: str) -> str:
    """The dtype SGLang runs the target in: ``dtype`` (``model.dtype``), or the checkpoint's for ``auto``."""
    if dtype != "auto":
        return dtype
    hf = read_target_config(model_path)
    return str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16")


def config_sha256(model_path: Path) -> str:
    """The digest of the target's ``config.json``, recorded in shards and drafts."""
    return hashlib.sha256((Path(model_path) / "config.json").read_bytes()).hexdigest()
