"""The EAGLE-3 draft, computing exactly what SGLang 0.5.23's ``LlamaForCausalLMEagle3`` (``llama``) or
``Eagle3DeepseekV2ForCausalLM`` (``deepseek_mla``, attention in :mod:`eaglebox.train.mla`) computes.

Names follow the exported checkpoint (``fc``, ``midlayer.*``, ``norm``, ``lm_head``). One draft step::

    h   = fc(fc_norm_i(aux_i) ...)      # step 0 only: [k*H_target] -> [H]; later steps feed h back
    x   = cat(input_layernorm(embed(token)), hidden_norm(h))         # [2H] into the attention
                                                # (trained as two halves: Eagle3Draft.token_proj)
    r   = o_proj(attn(x)) + h                                        # residual = h (not normed)
    out = down(silu(gate(n)) * up(n)) + r,  n = post_attention_layernorm(r)
    logits = lm_head(norm(out));  the next step's h = out (pre-norm), or norm(out) with norm_output

``fc_norm`` (one RMSNorm a captured layer) and ``norm_output`` are the EAGLE-3.1 options; both SGLang
classes implement them, and the trainer computes them as they do.

Training runs ``ttt_length`` such steps unrolled (:func:`eaglebox.train.ttt.ttt_forward`). Two sets of
kernels compute the same thing: eager, dense references (the CPU path and what tests compare
against) and, after :meth:`Eagle3Draft.compile_steps`, the CUDA path -- compiled step blocks,
block-sparse flex attention (:mod:`eaglebox.train.ttt`), the chunked
:class:`~eaglebox.train.loss.DraftHeadLoss` -- with the weights cast to bf16 once per forward
(:meth:`Eagle3Draft.step_weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglebox.draft.spec import DraftSpec
from eaglebox.train.loss import HEAD_CHUNKS
from eaglebox.train.mla import MLAAttention
from eaglebox.train.norm import RMSNorm, rms_norm
from eaglebox.train.rope import Rotary, apply_rotary
from eaglebox.train.ttt import flex_ttt_attention, ttt_attention, ttt_forward

PAD_MULTIPLE = 128  # CUDA batches are padded to this many tokens: flex attention's block size


class LlamaAttention(nn.Module):
    """SGLang's ``LlamaAttention`` of the draft: GQA heads of ``head_dim``, neox RoPE over the whole head."""

    def __init__(self, s: DraftSpec):
        super().__init__()
        self.spec = s
        self.q_proj = nn.Linear(2 * s.hidden_size, s.num_attention_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_attention_heads * s.head_dim, s.hidden_size, bias=False)
        self.rotary = Rotary(s)

    def in_weights(self) -> list[torch.Tensor]:
        """The projections of the step's [2H] input; the draft stacks their token and hidden halves
        (``in_tok``, ``in_hid``: :meth:`Eagle3Draft.step_weights`)."""
        return [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]

    def weights(self) -> dict[str, torch.Tensor]:
        return {"o": self.o_proj.weight}

    def qkv(self, w: dict, x: torch.Tensor, positions: torch.Tensor):
        """x: the step's input through ``in_weights`` [B, T, (heads + 2 kv_heads) d] -> q [B, heads, T, d],
        k and v [B, kv_heads, T, d]."""
        s = self.spec
        B, T, _ = x.shape
        q, k, v = x.split([s.num_attention_heads * s.head_dim] + 2 * [s.num_key_value_heads * s.head_dim], dim=-1)
        q = q.view(B, T, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = k.view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = v.view(B, T, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.rotary(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


ATTENTION = {"llama": LlamaAttention, "deepseek_mla": MLAAttention}


class MidLayer(nn.Module):
    def __init__(self, s: DraftSpec):
        super().__init__()
        H = s.hidden_size
        self.input_layernorm = RMSNorm(H)
        self.hidden_norm = RMSNorm(H)
        self.post_attention_layernorm = RMSNorm(H)
        self.self_attn = ATTENTION[s.architecture](s)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, s.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(H, s.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(s.intermediate_size, H, bias=False)


class Eagle3Draft(nn.Module):
    def __init__(self, spec: DraftSpec, loss: str = "soft_ce"):
        """``loss``: ``train.loss``, the key of :data:`~eaglebox.train.loss.HEAD_CHUNKS` whose chunk
        function scores the lm_head's rows."""
        super().__init__()
        self.spec = spec
        self.loss = loss
        H = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(spec.num_aux * spec.target_hidden_size, H, bias=False)
        self.fc_norm = nn.ModuleList(RMSNorm(spec.target_hidden_size) for _ in range(spec.num_aux)) \
            if spec.fc_norm else None
        self.midlayer = MidLayer(spec)
        self.norm = RMSNorm(H)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        # training kernels: the exact eager references (CPU); compile_steps() swaps in the fused ones
        self.attention = ttt_attention
        self.head_chunk = HEAD_CHUNKS[loss]

    def step_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The weights a draft step uses, cast to the compute dtype once per forward. Every TTT step
        reuses these copies, so the gradient is summed on them and reaches each fp32 master once.
        ``in_tok`` and ``in_hid`` stack the attention's projections of the [2H] input, its token and hidden
        halves, contiguous: strided halves of one stacked weight made the step's GEMMs slower
        (docs/measurements.md, "Measurements behind the code")."""
        m, mlp = self.midlayer, self.midlayer.mlp
        w = {"input_norm": m.input_layernorm.weight, "hidden_norm": m.hidden_norm.weight, **m.self_attn.weights(),
             "post_norm": m.post_attention_layernorm.weight, "gate": mlp.gate_proj.weight, "up": mlp.up_proj.weight,
             "down": mlp.down_proj.weight, "norm": self.norm.weight, "lm_head": self.lm_head.weight}
        w = {k: v.to(dtype) for k, v in w.items()}
        H = self.spec.hidden_size
        ins = m.self_attn.in_weights()
        w["in_tok"], w["in_hid"] = (torch.cat([x[:, half].to(dtype, memory_format=torch.contiguous_format) for x in ins])
                                    for half in (slice(None, H), slice(H, None)))
        return w

    def project_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """Step 0's ``h`` from the captured features [B, T, k*Ht]: per-layer ``fc_norm`` (if any), then ``fc``."""
        aux = aux.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            eps = self.spec.rms_norm_eps
            aux = torch.cat([rms_norm(c, n.weight, eps) for n, c in zip(self.fc_norm, aux.chunk(len(self.fc_norm), -1))],
                            dim=-1)
        return self.fc(aux)

    def token_proj(self, w: dict, ids: torch.Tensor, steps: int) -> torch.Tensor:
        """The token half of every TTT step's attention input, projected once: ``[B, T-1+steps, P]``,
        of which step ``i`` reads rows ``i .. i+T-1`` (its token at index t is ``ids[t+1+i]``, id 0
        past the end). The projection acts per token, so it commutes with the shift: one GEMM (and
        its gradients) instead of one a step, and no [2H] concatenation."""
        B, _ = ids.shape
        tokens = torch.cat([ids[:, 1:], ids.new_zeros(B, steps)], dim=1)
        e = self.embed_tokens(tokens).to(w["in_tok"].dtype)
        return F.linear(rms_norm(e, w["input_norm"], self.spec.rms_norm_eps), w["in_tok"])

    def qkv(self, w: dict, tok: torch.Tensor, h: torch.Tensor, positions: torch.Tensor):
        """Queries, keys and values of one draft step: SGLang's projection of
        ``cat(input_layernorm(embed), hidden_norm(h))``, as the token half (``tok``: this step's rows
        of :meth:`token_proj`) plus the hidden half. h: [B, T, H]; positions: [B, T]."""
        x = tok + F.linear(rms_norm(h, w["hidden_norm"], self.spec.rms_norm_eps), w["in_hid"])
        return self.midlayer.self_attn.qkv(w, x, positions)

    def finish(self, w: dict, h: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual and MLP. Returns the next step's ``h`` (the pre-norm output; the normed one with
        ``norm_output``) and the final norm (the lm_head input). attn: [B, heads, T, d_v]."""
        eps = self.spec.rms_norm_eps
        B, _, T, _ = attn.shape
        r = F.linear(attn.transpose(1, 2).reshape(B, T, -1), w["o"]) + h
        n = rms_norm(r, w["post_norm"], eps)
        out = F.linear(F.silu(F.linear(n, w["gate"])) * F.linear(n, w["up"]), w["down"]) + r
        normed = rms_norm(out, w["norm"], eps)
        return (normed if self.spec.norm_output else out), normed

    def forward(self, batch: dict, lm_head_weight: torch.Tensor, ttt_length: int):
        """Training forward (through ``forward`` so DDP's gradient hooks see it): see :func:`ttt_forward`."""
        return ttt_forward(self, batch, lm_head_weight, ttt_length)

    def compile_steps(self, max_length: int) -> None:
        """``torch.compile`` the per-step blocks (norms, RoPE, projections, MLP) and the loss chunk to
        fuse their elementwise work, and use block-sparse flex attention; for CUDA training.

        Batches are padded to a multiple of :data:`PAD_MULTIPLE` tokens, so blocks and attention see
        at most ``max_length / PAD_MULTIPLE`` lengths, and each length gets kernels of its own
        (``dynamic=False``; one cache entry per length, with room for twice that and for the one shape of
        :mod:`eaglebox.train.kernel_check`). Left to itself,
        torch.compile turns the second length it meets dynamic, and dynamic kernels ran slower
        (docs/measurements.md, "Measurements behind the code"). The loss chunk keeps torch.compile's default: its
        row count changes from step to step, so it turns dynamic on its second call."""
        lengths = -(-max_length // PAD_MULTIPLE)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * lengths + 1)
        self.qkv = torch.compile(self.qkv, dynamic=False)
        self.finish = torch.compile(self.finish, dynamic=False)
        self.attention = flex_ttt_attention
        self.head_chunk = torch.compile(HEAD_CHUNKS[self.loss])
