"""The draft's loss against the target's next-token distribution over the draft vocabulary, with the
lm_head fused in (:class:`DraftHeadLoss`, in row chunks, never holding fp32 logits). ``train.loss``
picks the chunk function (:data:`HEAD_CHUNKS`): soft cross entropy (:func:`head_chunk`, the default)
or LK^alpha (:func:`lk_alpha_chunk`), -log of the acceptance probability itself."""

from __future__ import annotations

import torch


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


ALPHA_FLOOR = 1e-6
"""Lower clamp of the acceptance probability in :func:`lk_alpha_chunk` (why: its docstring)."""


def lk_alpha_chunk(z: torch.Tensor, p: torch.Tensor, p_argmax: torch.Tensor, m: torch.Tensor):
    """:func:`head_chunk`'s arguments and returns for the LK^alpha loss (arXiv 2602.23881, "LK Losses:
    Direct Acceptance Rate Optimization for Speculative Decoding"): per row, ``-log alpha`` with
    ``alpha = sum_v min(p_v, q_v)``, ``q = softmax(z)``: the probability that speculative sampling
    accepts a token drafted from q against p (1 - TV(p, q)): the acceptance itself under sampled
    verification, not a proxy for it (greedy verification accepts by argmax instead). Computed in float32 whatever z's dtype; the gradient is
    closed-form: with ``s = sum_v q_v [q_v < p_v]``, ``d alpha / d z_j = q_j ([q_j < p_j] - s)`` and
    ``d loss / d z = -(d alpha / d z) / alpha``.

    alpha is clamped to :data:`ALPHA_FLOOR` in both the loss and the 1/alpha factor of the gradient:
    where the draft puts its mass on tokens to which the target gives (almost) none, alpha rounds
    to 0 in float32 (p and q both hold exact zeros after softmax underflow), and -log 0 = inf and
    1/alpha = inf would turn the step's gradient into NaN (one such row is enough, through the
    gradient clip's norm). With the floor a row's loss is at most -log(1e-6) = 13.8, and below it
    the row's gradient is d alpha / d z scaled by 1e6: the same direction, not the zero that
    autograd of ``alpha.clamp_min`` would give. A row with alpha exactly 0 has no gradient either
    way (every min is 0, so d alpha / d z = 0)."""
    q = z.float().softmax(-1)
    mf = m.to(q.dtype)
    below = q * (q < p)  # q_v where q_v < p_v: min(p_v, q_v) is q_v there
    alpha = torch.minimum(p, q).sum(-1)
    a = alpha.clamp_min(ALPHA_FLOOR)
    loss = -(a.log() * mf).sum()
    correct = ((z.argmax(-1) == p_argmax) & m).sum()
    grad = (q * below.sum(-1, keepdim=True) - below) * (mf / a)[:, None]
    return loss, correct, grad.to(z.dtype)


HEAD_CHUNKS = {"soft_ce": head_chunk, "lk_alpha": lk_alpha_chunk}
"""``train.loss`` -> the chunk function :class:`DraftHeadLoss` runs (compiled on CUDA:
:meth:`eaglebox.train.model.Eagle3Draft.compile_steps`)."""


class DraftHeadLoss(torch.autograd.Function):
    """The draft's lm_head and its loss for all TTT steps at once, in row chunks, never
    holding fp32 logits.

    Step ``i``'s rows ``xs[i]`` [B, L_i, H] are scored with lm_head ``w`` (in the compute dtype)
    against ``p[:, 1+i : 1+i+L_i]`` under ``masks[i]`` [B, L_i]; returns per-step summed losses and
    top-1 hits, both [steps]. Forward keeps only the logits' gradient, in the compute dtype -- what
    autograd holds for a bf16 lm_head, without the fp32 logits, log-probabilities and shifted
    targets beside it. The steps' rows sit in one buffer, so backward is two GEMMs over all of them:
    one lm_head gradient, not one per step summed. A step's loss needs only its own rows (the next
    step is fed the pre-norm output), which is why the head can wait until every step has run.
    Every row is computed, masked or not: gathering the scored rows costs a host sync and a
    scatter, which measured slower on the H200 than the wasted rows. ``chunk_fn`` is one of
    :data:`HEAD_CHUNKS` (:func:`head_chunk`, :func:`lk_alpha_chunk`) or its compiled form.
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
