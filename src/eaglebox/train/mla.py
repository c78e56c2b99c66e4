"""The draft's multi-latent attention, computing what SGLang 0.5.23's ``DeepseekV2AttentionMLA`` computes
inside ``Eagle3DeepseekV2ForCausalLM`` (``models/kimi_k25_eagle3.py``). Per token, from ``x`` [2H]::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))               # [heads, nope + rope]
    c, kpe = split(kv_a_proj_with_mqa(x), [kv_lora, rope])       # the cached latent and RoPE key
    k, v   = split(kv_b_proj(kv_a_layernorm(c)), [nope, v_dim])  # per head
    attn   = softmax([q_nope | rope(q_pe)] . [k | rope(kpe)] / sqrt(nope + rope)) v

SGLang serves the absorbed form (``kv_b_proj`` folded into q and the output, attention over the
latent); this is the same product with the latent expanded, so TTT runs it through the ordinary
attention kernels (:mod:`eaglebox.train.ttt`), keys of ``nope + rope`` and values of ``v_dim`` per head.
RoPE is interleaved (GPT-J pairs), SGLang's MLA default (``rope_interleave`` true), with default
frequencies only: SGLang turns any scaling block into DeepSeek YaRN, which ``draft_spec`` refuses.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from eaglebox.draft.spec import DraftSpec
from eaglebox.train.norm import RMSNorm, rms_norm
from eaglebox.train.rope import Rotary


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, d], pairs (x[2i], x[2i+1]) rotated by frequency i; cos/sin: [B, T, d] as
    :class:`~eaglebox.train.rope.Rotary` returns them (the first d/2 columns are the frequencies)."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :, :half].to(x.dtype), sin[:, None, :, :half].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


class MLAAttention(nn.Module):
    """Weights under SGLang's checkpoint names (its loader fuses ``q_a_proj`` and ``kv_a_proj_with_mqa``)."""

    def __init__(self, s: DraftSpec):
        super().__init__()
        H, h = s.hidden_size, s.num_attention_heads
        self.spec = s
        self.q_a_proj = nn.Linear(2 * H, s.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(s.q_lora_rank)
        self.q_b_proj = nn.Linear(s.q_lora_rank, h * (s.qk_nope_head_dim + s.qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * H, s.kv_lora_rank + s.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(s.kv_lora_rank)
        self.kv_b_proj = nn.Linear(s.kv_lora_rank, h * (s.qk_nope_head_dim + s.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * s.v_head_dim, H, bias=False)
        self.rotary = Rotary(replace(s, head_dim=s.qk_rope_head_dim))

    def in_weights(self) -> list[torch.Tensor]:
        """The projections of the step's [2H] input; the draft stacks their token and hidden halves
        (``in_tok``, ``in_hid``: :meth:`Eagle3Draft.step_weights`)."""
        return [self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight]

    def weights(self) -> dict[str, torch.Tensor]:
        return {"q_a_norm": self.q_a_layernorm.weight, "q_b": self.q_b_proj.weight,
                "kv_a_norm": self.kv_a_layernorm.weight, "kv_b": self.kv_b_proj.weight, "o": self.o_proj.weight}

    def qkv(self, w: dict, x: torch.Tensor, positions: torch.Tensor):
        """x: the step's input through ``in_weights`` [B, T, q_lora + kv_lora + rope] -> q, k
        [B, heads, T, nope + rope] and v [B, heads, T, v_dim]."""
        s, eps = self.spec, self.spec.rms_norm_eps
        B, T, _ = x.shape
        nope, rope = s.qk_nope_head_dim, s.qk_rope_head_dim
        q_a, kv_a = x.split([s.q_lora_rank, s.kv_lora_rank + rope], dim=-1)
        q = F.linear(rms_norm(q_a, w["q_a_norm"], eps), w["q_b"])
        q_nope, q_pe = q.view(B, T, -1, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        c, k_pe = kv_a.split([s.kv_lora_rank, rope], dim=-1)
        kv = F.linear(rms_norm(c, w["kv_a_norm"], eps), w["kv_b"]).view(B, T, -1, nope + s.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([nope, s.v_head_dim], dim=-1)
        cos, sin = self.rotary(positions)
        k_pe = apply_rotary_interleaved(k_pe[:, None], cos, sin).expand(-1, k_nope.shape[1], -1, -1)
        q = torch.cat([q_nope, apply_rotary_interleaved(q_pe, cos, sin)], dim=-1)
        return q, torch.cat([k_nope, k_pe], dim=-1), v
