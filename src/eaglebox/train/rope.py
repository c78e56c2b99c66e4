"""Rotary position embeddings with the target's parameters, in SGLang's (neox) layout."""

from __future__ import annotations

import torch
from torch import nn

from eaglebox.draft.spec import DraftSpec


class Rotary(nn.Module):
    """RoPE with the target's parameters, including Llama-3 style ``rope_scaling`` (via transformers)."""

    def __init__(self, spec: DraftSpec):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        cfg = LlamaConfig(hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
                          head_dim=spec.head_dim, max_position_embeddings=spec.max_position_embeddings,
                          rope_theta=spec.rope_theta, rope_scaling=spec.rope_scaling)
        params = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling or {}
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, spec.head_dim, 2).float() / spec.head_dim))
            self.attention_scaling = 1.0
        else:
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, d]; cos/sin: [B, T, d] (neox layout, as SGLang's Llama)."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
