"""CPU-only corrections to SGLang 0.5.23, active with the ``sgl_kernel`` stand-in (test and demo support).

**Tree-mask layout.** ``eagle_utils.default_tree_mask_mode()`` returns ``QLEN_ONLY`` on every CPU,
for the Intel AMX verify kernel. Without AMX the only CPU backend that can verify drafts is Triton
(run by its interpreter), and its target-verify reads ``custom_mask`` in the ``FULL_MASK`` layout
(``num_draft_tokens * (seq_len + num_draft_tokens)`` cells a request, see ``triton_backend.py``).
The tree kernel then writes a ``num_draft_tokens**2`` mask that is read as a longer one: the verify
attention masks the wrong cells, partly from stale buffer contents, so speculative output drifts
from greedy and differs between identical requests. Here the mode is ``FULL_MASK`` whenever AMX is
absent, which makes the Triton verify exact.

**MLA decode in torch.** With the Triton backend on CPU every kernel runs in Triton's interpreter.
For an MLA target's decode step (one token a request against the latent KV cache) that is one
interpreted program per request, layer and KV split: about 0.15-0.35 s each on a 2-core machine,
which made greedy generation on the tiny DeepSeek-V3 target run at ~1 token/s, too slow for
regeneration and held-out continuations in CI. :func:`mla_decode_attention` computes the same thing
(softmax(q k^T * scale) v with v the latent part of k, in float32) in torch; it replaces
``TritonAttnBackend.decode_attention_fwd`` for MLA decode calls without the options it does not
implement (paging, sinks, soft cap, score mods, KV scales), which still go to the Triton kernel.
Prefill, where features are captured, stays on SGLang's Triton kernels. Tested against SGLang's
kernel run by the interpreter (``tests/unit/test_cpu_kernels.py``).

**MLA target-verify in torch.** Served speculation verifies the drafts with an extend over the latent
cache under the draft-tree mask (``custom_mask``), run by the interpreter as one program per request,
head and query block for each of the target's layers at every verify step. :func:`mla_verify_attention`
computes the same thing in torch (the prefix fully visible, the draft tokens as the mask allows, the
mask read in the ``FULL_MASK`` layout past the prefix columns as the kernel reads it with
``skip_prefix_custom_mask``); it replaces ``TritonAttnBackend.extend_attention_fwd`` only on MLA backends
and only for calls with a custom mask and none of the options it does not implement, so prefill and
capture stay on SGLang's Triton kernels. Tested against SGLang's kernel under the interpreter
(``tests/unit/test_mla_spec_cpu.py``).

**Default RoPE on CPU.** On CPU SGLang's ``get_rope_wrapper`` goes to ``get_rope_cpu``, which asserts a
``deepseek_yarn`` block: a DeepSeek-style module with default RoPE, as eaglebox's MLA-form draft
(``Eagle3DeepseekV2ForCausalLM``, ``rope_scaling: null``) is, fails to load (``assert rope_scaling is not
None`` in ``rotary_embedding/factory.py``). Without a scaling block it gets what every other device
gets, ``get_rope`` (SGLang's ``RotaryEmbedding``, torch on a CPU without AMX).

**No CUDA calls in the MLA draft's embedding hand-over.** ``Eagle3DeepseekV2ForCausalLM.set_embed`` and
``set_embed_and_head`` (``models/kimi_k25_eagle3.py``) end with ``torch.cuda.empty_cache()`` and
``torch.cuda.synchronize()``; on a machine without a driver the speculative server then dies while it
shares the target's embedding with the draft ("Found no NVIDIA driver"). For tensors not on a GPU the
same assignments are made without those two calls.
"""

from __future__ import annotations

import os

from eaglebox.engine.post_import import on_import

EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
TRITON_BACKEND = "sglang.srt.layers.attention.triton_backend"
ROPE_FACTORY = "sglang.srt.layers.rotary_embedding.factory"
MLA_DRAFT = "sglang.srt.models.kimi_k25_eagle3"


def _full_mask_without_amx(module) -> None:
    from sglang.srt.utils import cpu_has_amx_support

    if cpu_has_amx_support():
        return
    module.default_tree_mask_mode = lambda: module.TreeMaskMode.FULL_MASK


def mla_decode_attention(q, k_buffer, o, kv_indptr, kv_indices, sm_scale: float) -> None:
    """Decode attention over an MLA latent cache, written into ``o`` [batch, heads, Lv]: request ``b``
    attends over the rows ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` of ``k_buffer`` [slots, 1, Lk];
    its values are the first Lv columns of those rows (the latent), as SGLang's kernel reads them."""
    import torch

    lv, kv_indptr = o.shape[-1], kv_indptr[: q.shape[0] + 1]
    start, lens = kv_indptr[:-1].long(), (kv_indptr[1:] - kv_indptr[:-1]).long()
    pos = torch.arange(int(lens.max()) if lens.numel() else 0, device=q.device)
    valid = pos[None, :] < lens[:, None]  # [batch, longest]
    rows = kv_indices[(start[:, None] + pos[None, :]).clamp(max=max(kv_indices.numel() - 1, 0))].long()
    k = k_buffer[rows, 0].float()  # [batch, longest, Lk]
    scores = torch.einsum("bhd,bsd->bhs", q.float(), k) * sm_scale
    p = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
    o.copy_(torch.einsum("bhs,bsv->bhv", p, k[..., :lv]).to(o.dtype))


def mla_verify_attention(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                         custom_mask, mask_indptr, sm_scale: float) -> None:
    """Target-verify attention (an extend with a draft-tree mask), written into ``o`` [tokens, heads, Lv]:
    request ``b``'s queries ``q[qo_indptr[b]:qo_indptr[b + 1]]`` see all of its prefix (rows
    ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` of the KV buffers) and the draft tokens that
    ``custom_mask`` allows, read in the ``FULL_MASK`` layout past the prefix columns as SGLang's kernel
    reads it (``skip_prefix_custom_mask``). KV heads are shared by ``heads // kv_heads`` query heads."""
    import torch

    group = q.shape[1] // k_extend.shape[1]
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        n, plen = q1 - q0, p1 - p0
        if n == 0:
            continue
        rows = kv_indices[p0:p1].long()
        k = torch.cat([k_buffer[rows], k_extend[q0:q1]]).float().repeat_interleave(group, dim=1)
        v = torch.cat([v_buffer[rows], v_extend[q0:q1]]).float().repeat_interleave(group, dim=1)
        m0 = int(mask_indptr[b])
        cells = custom_mask[m0 : m0 + n * (plen + n)].view(n, plen + n).bool()
        allowed = torch.cat([torch.ones(n, plen, dtype=torch.bool, device=q.device), cells[:, plen:]], dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k) * sm_scale
        p = torch.softmax(scores.masked_fill(~allowed[None], float("-inf")), dim=-1)
        o[q0:q1] = torch.einsum("hqk,khv->qhv", p, v).to(o.dtype)


def _torch_mla_decode(module) -> None:
    cls = module.TritonAttnBackend
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        triton_decode = self.decode_attention_fwd

        def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                                 num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, **kw):
            plain = (kw.get("has_mla") and kw.get("page_size", 1) == 1 and kw.get("sinks") is None
                     and not kw.get("logit_cap") and kw.get("xai_temperature_len", -1) <= 0
                     and kw.get("score_mod") is None and k_scale == 1.0 and v_scale == 1.0
                     and k_buffer.dim() == 3 and k_buffer.shape[1] == 1 and not q.is_cuda)
            if not plain:
                return triton_decode(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                                     num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, **kw)
            mla_decode_attention(q, k_buffer, o, kv_indptr, kv_indices, sm_scale)

        self.decode_attention_fwd = decode_attention_fwd
        if getattr(self, "use_mla", False):
            triton_extend = self.extend_attention_fwd

            def extend_attention_fwd(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr,
                                     kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend,
                                     k_scale=1.0, v_scale=1.0, sm_scale=None, **kw):
                plain = (custom_mask is not None and mask_indptr is not None and not q.is_cuda
                         and sm_scale is not None and k_scale == 1.0 and v_scale == 1.0
                         and kw.get("skip_prefix_custom_mask", True) and not kw.get("logit_cap")
                         and kw.get("sliding_window_size", -1) <= 0 and kw.get("sinks") is None
                         and kw.get("window_kv_offsets") is None and kw.get("xai_temperature_len", -1) <= 0
                         and kw.get("lse_extend") is None and not kw.get("skip_prefix")
                         and not kw.get("skip_extend") and kw.get("page_size", 1) == 1
                         and kw.get("score_mod") is None and kw.get("aux_tensors") is None)
                if not plain:
                    return triton_extend(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr,
                                         kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend,
                                         k_scale, v_scale, sm_scale, **kw)
                mla_verify_attention(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr,
                                     kv_indices, custom_mask, mask_indptr, sm_scale)

            self.extend_attention_fwd = extend_attention_fwd

    cls.__init__ = __init__


def _default_rope_on_cpu(module) -> None:
    cpu_rope = module.get_rope_cpu

    def get_rope_cpu(head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                     dtype=None, partial_rotary_factor=1.0, device=None):
        if rope_scaling is None:
            return module.get_rope(head_size, rotary_dim, max_position, base, is_neox_style, None, dtype,
                                   partial_rotary_factor)
        return cpu_rope(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                        partial_rotary_factor, device)

    module.get_rope_cpu = get_rope_cpu


def _mla_draft_embed_without_cuda(module) -> None:
    cls = module.Eagle3DeepseekV2ForCausalLM
    set_embed, set_embed_and_head = cls.set_embed, cls.set_embed_and_head

    def cpu_set_embed(self, embed):
        if embed.is_cuda:
            return set_embed(self, embed)
        h = getattr(self.config, "target_hidden_size", None)
        if h is not None and h != self.config.hidden_size:
            return None  # as SGLang's: a draft of another width keeps its own embedding
        del self.model.embed_tokens.weight
        self.model.embed_tokens.weight = embed
        return None

    def cpu_set_embed_and_head(self, embed, head):
        if embed.is_cuda:
            return set_embed_and_head(self, embed, head)
        del self.model.embed_tokens.weight
        del self.lm_head.weight
        self.model.embed_tokens.weight = embed
        self.lm_head.weight = head
        return None

    cls.set_embed, cls.set_embed_and_head = cpu_set_embed, cpu_set_embed_and_head


def install() -> None:
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        on_import(EAGLE_UTILS, _full_mask_without_amx)
        on_import(TRITON_BACKEND, _torch_mla_decode)
        on_import(ROPE_FACTORY, _default_rope_on_cpu)
        on_import(MLA_DRAFT, _mla_draft_embed_without_cuda)
