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

Two sets of kernels compute the same thing: eager, dense references (the CPU path and what tests
compare against) and, after :meth:`Eagle3Draft.compile_steps`, the CUDA path -- compiled step
blocks, block-sparse flex attention, the chunked :class:`DraftHeadLoss` -- with the weights cast
to bf16 once per forward (:meth:`Eagle3Draft.step_weights`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

PAD_MULTIPLE = 128  # CUDA batches are padded to this many tokens: flex attention's block size


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class RMSNorm(nn.Module):
    """A norm's weight, under the name SGLang's checkpoint gives it; the norm is :func:`rms_norm`,
    applied to the step's cast copy of it (:meth:`Eagle3Draft.step_weights`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


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
        self.input_layernorm = RMSNorm(H)
        self.hidden_norm = RMSNorm(H)
        self.post_attention_layernorm = RMSNorm(H)
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
        self.norm = RMSNorm(H)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(spec)
        # training kernels: the exact eager references (CPU); compile_steps() swaps in the fused ones
        self.attention = ttt_attention
        self.head_chunk = head_chunk

    def step_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The weights a draft step uses, cast to the compute dtype once per forward. Every TTT step
        reuses these copies, so the gradient is summed on them and reaches each fp32 master once."""
        m, a, mlp = self.midlayer, self.midlayer.self_attn, self.midlayer.mlp
        w = {"input_norm": m.input_layernorm.weight, "hidden_norm": m.hidden_norm.weight,
             "q": a.q_proj.weight, "k": a.k_proj.weight, "v": a.v_proj.weight, "o": a.o_proj.weight,
             "post_norm": m.post_attention_layernorm.weight, "gate": mlp.gate_proj.weight, "up": mlp.up_proj.weight,
             "down": mlp.down_proj.weight, "norm": self.norm.weight, "lm_head": self.lm_head.weight}
        return {k: v.to(dtype) for k, v in w.items()}

    def qkv(self, w: dict, embeds: torch.Tensor, h: torch.Tensor, positions: torch.Tensor):
        """Queries, keys and values of one draft step. embeds, h: [B, T, H]; positions: [B, T]."""
        s = self.spec
        eps = s.rms_norm_eps
        x = torch.cat([rms_norm(embeds, w["input_norm"], eps), rms_norm(h, w["hidden_norm"], eps)], dim=-1)
        B, T, _ = x.shape
        q = F.linear(x, w["q"]).view(B, T, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = F.linear(x, w["k"]).view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = F.linear(x, w["v"]).view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.rotary(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, w: dict, h: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual and MLP. Returns the step's pre-norm output (the next step's ``h``) and its final
        norm (the lm_head input). attn: [B, heads, T, d]."""
        eps = self.spec.rms_norm_eps
        B, _, T, _ = attn.shape
        r = F.linear(attn.transpose(1, 2).reshape(B, T, -1), w["o"]) + h
        n = rms_norm(r, w["post_norm"], eps)
        out = F.linear(F.silu(F.linear(n, w["gate"])) * F.linear(n, w["up"]), w["down"]) + r
        return out, rms_norm(out, w["norm"], eps)

    def forward(self, batch: dict, lm_head_weight: torch.Tensor, ttt_length: int):
        """Training forward (through ``forward`` so DDP's gradient hooks see it): see :func:`ttt_forward`."""
        return ttt_forward(self, batch, lm_head_weight, ttt_length)

    def compile_steps(self, max_length: int) -> None:
        """``torch.compile`` the per-step blocks (norms, RoPE, projections, MLP) and the loss chunk to
        fuse their elementwise work, and use block-sparse flex attention; for CUDA training.

        Batches are padded to a multiple of :data:`PAD_MULTIPLE` tokens, so blocks and attention see
        at most ``max_length / PAD_MULTIPLE`` lengths, and each length gets kernels of its own
        (``dynamic=False``; one cache entry per length, with room for twice that). Left to itself,
        torch.compile turns the second length it meets dynamic, and on the H200 dynamic kernels ran
        10 % slower (0.075 against 0.068 s/step). The loss chunk keeps torch.compile's default: its
        row count changes from step to step, so it turns dynamic on its second call."""
        lengths = -(-max_length // PAD_MULTIPLE)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * lengths)
        self.qkv = torch.compile(self.qkv, dynamic=False)
        self.finish = torch.compile(self.finish, dynamic=False)
        self.attention = flex_ttt_attention
        self.head_chunk = torch.compile(head_chunk)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                  valid: torch.Tensor, steps: int | None = None) -> torch.Tensor:
    """Attention of TTT step ``i = len(keys) - 1``.

    ``keys[0]`` (step 0) is attended causally; ``keys[j]`` for ``j >= 1`` only at the query's own index
    (the diagonal). ``valid`` [B, T] masks padding keys. Dense and exact: the CPU path, and the
    reference :func:`flex_ttt_attention` is tested against (``steps``, the unroll length, only
    matters there).
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


def ttt_mask_mod(T: int, limit: torch.Tensor):
    """The mask of :func:`ttt_attention` as a flex-attention ``mask_mod`` over keys ``[step 0 | 1 | ...]``:
    key ``kv`` is sequence index ``kv % T`` of step ``kv // T``; keys at or past ``limit`` are padding."""

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx % T
        return (j <= q_idx) & ((kv_idx < T) | ((j == q_idx) & (kv_idx < limit)))

    return mask_mod


_compiled_flex = None
_block_masks: dict = {}


def flex_ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                       valid: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`ttt_attention` with a block-sparse mask: step ``i`` costs a causal ``T x T`` plus ``i``
    diagonal blocks, not a dense ``T x (i+1)T``. Keys are zero-padded to all ``steps`` (blocks
    the mask skips, so no work) so that one compiled kernel serves every step. Batches are padded
    on the right, so a padding key is only ever seen by padding queries (causal and diagonal keys
    sit at or before the query) and ``valid`` needs no mask here: the block mask depends only on
    the length and the step, and is built once per pair. Compiled on CUDA, eager (a dense
    reference inside flex) elsewhere."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, Hq, T, _ = q.shape
    pad = [keys[0].new_zeros(*keys[0].shape[:2], (steps - len(keys)) * T, keys[0].shape[3])]
    k, v = torch.cat(keys + pad, dim=2), torch.cat(values + pad, dim=2)
    on_gpu = q.device.type == "cuda"
    key = (T, steps, len(keys), q.device)
    if key not in _block_masks:
        limit = torch.tensor(len(keys) * T, device=q.device)
        _block_masks[key] = create_block_mask(ttt_mask_mod(T, limit), None, None, T, steps * T, device=q.device,
                                              _compile=on_gpu)
    if on_gpu and _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)  # see compile_steps
    fn = _compiled_flex if on_gpu else flex_attention
    return fn(q, k, v, block_mask=_block_masks[key], enable_gqa=Hq != k.shape[1])


def target_probs(last: torch.Tensor, lm_head_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
                 chunk: int = 1024):
    """The target's next-token distribution restricted to the draft vocabulary, and whether the
    target's own argmax (over the full vocabulary) lies in it. last: [B, T, H]."""
    draft_ids = d2t + torch.arange(d2t.shape[0], device=d2t.device)  # SGLang's hot_token_id
    probs, in_vocab = [], []
    flat = last.reshape(-1, last.shape[-1])
    w = lm_head_weight.to(last.dtype)
    for rows in flat.split(chunk):
        full = rows @ w.T  # in the target's dtype, as its lm_head runs when serving
        in_vocab.append(t2d[full.argmax(-1)])
        probs.append(full[:, draft_ids].float().softmax(-1))
    shape = last.shape[:-1]
    return torch.cat(probs).view(*shape, -1), torch.cat(in_vocab).view(shape)


def head_chunk(z: torch.Tensor, p: torch.Tensor, p_argmax: torch.Tensor, m: torch.Tensor):
    """One chunk of draft logits ``z`` [R, V] against target distributions ``p`` [R, V] (rows sum to
    1) under mask ``m`` [R]: the summed soft cross entropy, the top-1 hits, and d loss / d z
    (``softmax(z) - p``) in z's dtype."""
    logp = z.float().log_softmax(-1)
    mf = m.to(logp.dtype)
    loss = -((p * logp).sum(-1) * mf).sum()
    correct = ((z.argmax(-1) == p_argmax) & m).sum()
    return loss, correct, ((logp.exp() - p) * mf[:, None]).to(z.dtype)


class DraftHeadLoss(torch.autograd.Function):
    """The draft's lm_head and its soft-target loss for all TTT steps at once, in row chunks, never
    holding fp32 logits.

    Step ``i``'s rows ``xs[i]`` [B, L_i, H] are scored with lm_head ``w`` (in the compute dtype)
    against ``p[:, 1+i : 1+i+L_i]`` under ``masks[i]`` [B, L_i]; returns per-step summed losses and
    top-1 hits, both [steps]. Forward keeps only the logits' gradient, in the compute dtype -- what
    autograd holds for a bf16 lm_head, without the fp32 logits, log-probabilities and shifted
    targets beside it. The steps' rows sit in one buffer, so backward is two GEMMs over all of them:
    one lm_head gradient, not one per step summed. A step's loss needs only its own rows (the next
    step is fed the pre-norm output), which is why the head can wait until every step has run.
    Every row is computed, masked or not: gathering the scored rows costs a host sync and a
    scatter, which measured slower on the H200 than the wasted rows. ``chunk_fn`` is
    :func:`head_chunk` or its compiled form.
    """

    @staticmethod
    def forward(ctx, w, p, p_argmax, masks, chunk_fn, *xs):
        B = xs[0].shape[0]
        lengths = [x.shape[1] for x in xs]
        x_all = torch.cat([x.to(w.dtype) for x in xs], dim=1)  # [B, sum L_i, H]
        grads = torch.empty(B, x_all.shape[1], w.shape[0], dtype=w.dtype, device=w.device)
        loss = torch.zeros(len(xs), dtype=torch.float32, device=w.device)
        correct = torch.zeros(len(xs), dtype=torch.int64, device=w.device)
        rows = max(1, 2**26 // w.shape[0])  # 256 MB of fp32 logits at a time
        start = 0
        for i, (L, m) in enumerate(zip(lengths, masks)):
            for b in range(B):
                for s in range(0, L, rows):
                    e = min(L, s + rows)
                    lo, hit, grads[b, start + s : start + e] = chunk_fn(
                        x_all[b, start + s : start + e] @ w.T, p[b, 1 + i + s : 1 + i + e],
                        p_argmax[b, 1 + i + s : 1 + i + e], m[b, s:e])
                    loss[i] += lo
                    correct[i] += hit
            start += L
        ctx.save_for_backward(x_all, w, grads)
        ctx.lengths, ctx.x_dtype = lengths, xs[0].dtype
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        x_all, w, grads = ctx.saved_tensors
        g_loss = grad_loss.to(w.dtype)  # step i's rows scaled by its loss weight; no host copy (graph-safe)
        scale = torch.cat([g_loss[i : i + 1].expand(n) for i, n in enumerate(ctx.lengths)])[None, :, None]
        g = grads.flatten(0, 1)
        grad_x = (grads @ w).mul_(scale).to(ctx.x_dtype)
        grad_w = g.T @ (x_all * scale).flatten(0, 1)  # scale the smaller operand, not the [V, H] result
        return (grad_w, None, None, None, None, *grad_x.split(ctx.lengths, dim=1))


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n]; the last n positions get ``fill``."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_forward(model: Eagle3Draft, batch: dict, lm_head_weight: torch.Tensor,
                ttt_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed losses, correct top-1 counts and scored positions, each [ttt_length], for a padded batch.

    batch: ``input_ids`` [B, T], ``loss_mask`` [B, T], ``aux`` [B, T, k*Ht], ``last`` [B, T, Ht],
    ``valid`` [B, T] (False on padding). Sums, not means: the caller normalises after summing over
    ranks, so the result does not depend on how the data was split.
    """
    ids, valid = batch["input_ids"], batch["valid"]
    B, T = ids.shape
    probs, in_vocab = target_probs(batch["last"], lm_head_weight, model.d2t, model.t2d)
    probs_argmax = probs.argmax(-1)
    # index t predicts x[t+2+i] (an assistant token) from the target's distribution at t+1+i (whose
    # argmax lies in the draft vocabulary)
    scored = batch["loss_mask"].bool() & valid
    h = model.fc(batch["aux"].to(model.fc.weight.dtype))
    positions = torch.arange(T, device=ids.device)[None].expand(B, T)
    dtype = torch.get_autocast_dtype(ids.device.type) if torch.is_autocast_enabled(ids.device.type) else h.dtype
    w = model.step_weights(dtype)
    h = h.to(dtype)
    keys, values, rows, masks = [], [], [], []
    for i in range(ttt_length):
        tok = shift_left(ids, 1 + i)
        q, k, v = model.qkv(w, model.embed_tokens(tok).to(dtype), h, positions + i)
        keys.append(k)
        values.append(v)
        h, normed = model.finish(w, h, model.attention(q, keys, values, valid, ttt_length))
        L = T - 1 - i  # rows t whose target distribution (at t+1+i) exists
        rows.append(normed[:, :L])
        masks.append(shift_left(scored, 2 + i, False)[:, :L] & in_vocab[:, 1 + i :])
    losses, correct = DraftHeadLoss.apply(w["lm_head"], probs, probs_argmax, masks, model.head_chunk, *rows)
    return losses, correct, torch.stack([m.sum() for m in masks])
