"""The target's ``config.json``: the language model's shape, its architecture, its dtype."""

from __future__ import annotations

import json
from pathlib import Path

from eaglebox.errors import EagleboxError


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


def architecture(model_path: Path) -> str:
    """``architectures[0]``: the class SGLang instantiates (for a VLM wrapper, the wrapper's)."""
    archs = read_target_config(model_path).get("architectures") or []
    if not archs:
        raise EagleboxError(f"{Path(model_path) / 'config.json'}: architectures: missing; SGLang picks the model "
                            "class from it (e.g. [\"LlamaForCausalLM\"])")
    return str(archs[0])


def is_mla(model_path: Path) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): the KV cache holds a ``kv_lora_rank`` latent."""
    return text_config(model_path).get("kv_lora_rank") is not None


def target_dtype(model_path: Path, dtype: str) -> str:
    """The dtype SGLang runs the target in: ``dtype`` (``model.dtype``), or the checkpoint's for ``auto``."""
    if dtype != "auto":
        return dtype
    hf = read_target_config(model_path)
    return str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16")
