"""The draft's shape, and how it follows from the target and ``train.draft``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from eaglebox.errors import EagleboxError
from eaglebox.target.config import text_config


@dataclass(frozen=True)
class DraftSpec:
    hidden_size: int
    target_hidden_size: int
    num_aux: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int

    def to_dict(self) -> dict:
        return asdict(self)


def draft_spec(model_path: Path, draft_cfg, num_aux: int) -> DraftSpec:
    """The target's shape and RoPE, with the heads and widths ``draft_cfg`` (``train.draft``) overrides."""
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
