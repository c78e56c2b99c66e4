"""What the draft takes from the target: its shape, RoPE, frozen embeddings and lm_head.

Only the two tensors are read (through the safetensors index), never the whole checkpoint: a
1T-parameter target's embedding and head are a few GB, its experts are not touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from eaglebox.engine.launch import text_config
from eaglebox.errors import EagleboxError
from eaglebox.train.model import DraftSpec


def draft_spec(model_path: Path, draft_cfg, num_aux: int) -> DraftSpec:
    t = text_config(model_path)
    H = int(t["hidden_size"])
    target_heads = int(t["num_attention_heads"])
    heads = draft_cfg.num_attention_heads or target_heads
    kv = draft_cfg.num_key_value_heads or int(t.get("num_key_value_heads", heads))
    # the target's head_dim unless the draft names its own head count
    head_dim = H // heads if draft_cfg.num_attention_heads else int(t.get("head_dim") or H // target_heads)
    if heads % kv:
        raise EagleboxError(f"train.draft: {heads} attention heads are not a multiple of {kv} KV heads")
    rope = t.get("rope_parameters") or t.get("rope_scaling")
    theta = float(t.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0)
    if rope and rope.get("rope_type", rope.get("type")) == "default":
        rope = None
    return DraftSpec(
        hidden_size=H, target_hidden_size=H, num_aux=num_aux, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim,
        intermediate_size=draft_cfg.intermediate_size or int(t["intermediate_size"]),
        vocab_size=int(t["vocab_size"]), draft_vocab_size=draft_cfg.draft_vocab_size,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=rope,
        max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
    )


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


def load_embed_and_head(model_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens.weight, lm_head.weight) of the target; a tied head is the embedding."""
    model_path = Path(model_path)
    files = _weight_files(model_path)

    def find(suffix: str) -> str | None:
        hits = sorted(k for k in files if k.endswith(suffix) and "mtp" not in k)
        return hits[0] if hits else None

    embed_key = find("embed_tokens.weight")
    head_key = find("lm_head.weight") or embed_key
    if embed_key is None:
        raise EagleboxError(f"{model_path}: no embed_tokens.weight in the checkpoint")

    def load(key):
        with safe_open(str(files[key]), "pt") as st:
            return st.get_tensor(key)

    return load(embed_key), load(head_key)
