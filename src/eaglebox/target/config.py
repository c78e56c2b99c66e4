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
    """The language model's part of the target config (VLM wrappers such as Kimi-K2.5 nest it), with its
    RoPE spelled one way only (:func:`check_rope`)."""
    hf = read_target_config(model_path)
    text = hf.get("text_config", hf)
    check_rope(text, Path(model_path) / "config.json", "text_config." if "text_config" in hf else "")
    return text


def check_rope(text: dict, path: Path, prefix: str = "") -> None:
    """Refuse ``rope_scaling`` beside a ``rope_parameters`` that says otherwise (``type`` read as
    ``rope_type``; a ``rope_theta`` on one side only is the top-level one), and a top-level ``rope_theta``
    other than ``rope_parameters``'. transformers 5 runs ``rope_scaling`` when both are set (SGLang
    0.5.23 reads transformers' config), eaglebox's draft reads ``rope_parameters``: the draft would be
    trained with RoPE the target does not run."""
    scaling, params = text.get("rope_scaling"), text.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in text and params.get("rope_theta", text["rope_theta"]) != text["rope_theta"]:
        raise EagleboxError(f"{path}: {prefix}rope_theta {text['rope_theta']} and {prefix}rope_parameters.rope_theta "
                            f"{params['rope_theta']} disagree; transformers and SGLang run the latter: keep one")
    if not (isinstance(scaling, dict) and isinstance(params, dict) and scaling and params):
        return

    def norm(block: dict) -> dict:
        out = {("rope_type" if k == "type" else k): v for k, v in block.items()}
        out.setdefault("rope_type", "default")
        return out

    a, b = norm(scaling), norm(params)
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not (k == "rope_theta" and None in (a.get(k), b.get(k))))
    if diff:
        raise EagleboxError(f"{path}: {prefix}rope_scaling and {prefix}rope_parameters disagree on "
                            + ", ".join(f"{k} ({a.get(k)!r} vs {b.get(k)!r})" for k in diff)
                            + "; transformers and SGLang 0.5.23 run rope_scaling, eaglebox would read rope_parameters: "
                            "keep one of them")


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
    """The dtype SGLang runs the target in: ``dtype`` (``model.dtype``), or the checkpoint's for ``auto``
    (its ``dtype``, which transformers 5 reads before the older ``torch_dtype``)."""
    if dtype != "auto":
        return dtype
    hf = read_target_config(model_path)
    if hf.get("dtype") and hf.get("torch_dtype") and hf["dtype"] != hf["torch_dtype"]:
        raise EagleboxError(f"{Path(model_path) / 'config.json'}: dtype {hf['dtype']!r} and torch_dtype "
                            f"{hf['torch_dtype']!r} disagree; transformers 5 and SGLang 0.5.23 run dtype: keep one, "
                            "or set model.dtype")
    return str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16")
