"""The EAGLE-3 draft, computing exactly what SGLang 0.5.23's ``LlamaForCausalLMEagle3`` computes.

Names follow the exported checkpoint (``fc``, ``midlayer.*``, ``norm``, ``lm_head``). One draft step::

    h   = fc(aux)                       # step 0 only: [k*H_target] -> [H]; later steps feed h back
    x   = cat(input_layernorm(embed(token)), hidden_norm(h))         # [2H] into q/k/v
    r   = o_proj(attn(x)) + h                                        # residual = h (not normed)
    out = down(silu(gate(n)) * up(n)) + r,  n = post_attention_layernorm(r)
    logits = lm_head(norm(out));  the next step's h = out (pre-norm)

Training-time test (TTT) unrolls ``ttt_length`` such steps. Step ``i`` at sequence index ``t`` sees
the target's features at ``t``, the token ``x[t+1+i]`` and predicts ``x[t+2+i]``; its query sits at
position ``t+i`` and attends to step 0's keys at positions ``<= t`` and to its own earlier steps'
keys at the same index -- what chain drafting does at inference (SGLang step ``j`` runs at
position ``q+j`` over the verified prefix and the draft tokens before it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


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


class MidLayer(nn.Module):
    def __init__(self, s: DraftSpec):
        super().__init__()
        H = s.hidden_size
        self.input_layernorm = RMSNorm(H, s.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, s.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * H, s.num_attention_heads * s.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * H, s.num_key_value_heads * s.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * H, s.num_key_value_heads * s.head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(s.num_attention_heads * s.head_dim, H, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, s.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(H, s.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(s.intermediate_size, H, bias=False)


class Eagle3Draft(nn.Module):
    def __init__(self, spec: DraftSpec):
        super().__init__()
        self.spec = spec
        H = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(spec.num_aux * spec.target_hidden_size, H, bias=False)
        self.midlayer = MidLayer(spec)
        self.norm = RMSNorm(H, spec.rms_norm_eps)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(spec)

    def qkv(self, embeds: torch.Tensor, h: torch.Tensor, positions: torch.Tensor):
        """Queries, keys and values of one draft step. embeds, h: [B, T, H]; positions: [B, T]."""
        s, m = self.spec, self.midlayer
        x = torch.cat([m.input_layernorm(embeds), m.hidden_norm(h)], dim=-1)
        B, T, _ = x.shape
        q = m.self_attn.q_proj(x).view(B, T, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.rotary(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual, MLP: the step's pre-norm output (the next step's ``h``). attn: [B, heads, T, d]."""
        m = self.midlayer
        B, _, T, _ = attn.shape
        r = m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + h
        n = m.post_attention_layernorm(r)
        return m.mlp.down_proj(F.silu(m.mlp.gate_proj(n)) * m.mlp.up_proj(n)) + r

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))

    def forward(self, batch: dict, lm_head_weight: torch.Tensor, ttt_length: int):
        """Training forward (through ``forward`` so DDP's gradient hooks see it): see :func:`ttt_forward`."""
        return ttt_forward(self, batch, lm_head_weight, ttt_length)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                  valid: torch.Tensor) -> torch.Tensor:
    """Attention of TTT step ``i = len(keys) - 1``.

    ``keys[0]`` (step 0) is attended causally; ``keys[j]`` for ``j >= 1`` only at the query's own index
    (the diagonal). ``valid`` [B, T] masks padding keys. Dense and exact: the reference the other
    backends are tested against, and fast enough for CPU and short sequences.
    """
    B, Hq, T, d = q.shape
    rep = Hq // keys[0].shape[1]
    k = torch.cat(keys, dim=2).repeat_interleave(rep, dim=1)
    v = torch.cat(values, dim=2).repeat_interleave(rep, dim=1)
    idx = torch.arange(T, device=q.device)
    causal = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]  # [B, T, T]
    diag = torch.eye(T, dtype=torch.bool, device=q.device)[None].expand(B, T, T)
    mask = torch.cat([causal] + [diag] * (len(keys) - 1), dim=-1)  # [B, T, (i+1)T]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=1.0 / math.sqrt(d))


def target_probs(last: torch.Tensor, lm_head_weight: torch.Tensor, t2d: torch.Tensor, chunk: int = 1024):
    """The target's next-token distribution restricted to the draft vocabulary, and whether the
    target's own argmax (over the full vocabulary) lies in it. last: [B, T, H]."""
    draft_ids = t2d.nonzero().squeeze(-1)
    probs, in_vocab = [], []
    flat = last.reshape(-1, last.shape[-1])
    w = lm_head_weight.to(last.dtype)
    for rows in flat.split(chunk):
        full = rows @ w.T  # in the target's dtype, as its lm_head runs when serving
        in_vocab.append(t2d[full.argmax(-1)])
        probs.append(full[:, draft_ids].float().softmax(-1))
    shape = last.shape[:-1]
    return torch.cat(probs).view(*shape, -1), torch.cat(in_vocab).view(shape)


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n]; the last n positions get ``fill``."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_forward(model: Eagle3Draft, batch: dict, lm_head_weight: torch.Tensor, ttt_length: int,
                attention=ttt_attention) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Summed losses, correct top-1 counts and scored positions, per TTT step, for a padded batch.

    batch: ``input_ids`` [B, T], ``loss_mask`` [B, T], ``aux`` [B, T, k*Ht], ``last`` [B, T, Ht],
    ``valid`` [B, T] (False on padding). Sums, not means: the caller normalises after summing over
    ranks, so the result does not depend on how the data was split.
    """
    ids, valid = batch["input_ids"], batch["valid"]
    B, T = ids.shape
    probs, in_vocab = target_probs(batch["last"], lm_head_weight, model.t2d)
    # index t predicts x[t+2+i] from the target's distribution at t+1+i
    scored = (batch["loss_mask"].bool() & valid)
    h = model.fc(batch["aux"].to(model.fc.weight.dtype))
    positions = torch.arange(T, device=ids.device)[None].expand(B, T)
    keys, values, losses, correct, counts = [], [], [], [], []
    for i in range(ttt_length):
        tok = shift_left(ids, 1 + i)
        q, k, v = model.qkv(model.embed_tokens(tok).to(h.dtype), h, positions + i)
        keys.append(k)
        values.append(v)
        h = model.finish(h, attention(q, keys, values, valid))
        p = shift_left(probs, 1 + i)
        mask = shift_left(scored, 2 + i, False) & shift_left(in_vocab, 1 + i, False) & shift_left(valid, 2 + i, False)
        logp = model.logits(h).float().log_softmax(-1)
        losses.append(-(p * logp).sum(-1).masked_select(mask).sum())
        with torch.no_grad():
            correct.append(((logp.argmax(-1) == p.argmax(-1)) & mask).sum())
            counts.append(mask.sum())
    return losses, correct, counts
