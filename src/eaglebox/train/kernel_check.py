"""The CUDA training kernels measured against the eager references, on the draft's own shapes, before training.

Why: the compiled step blocks and flex attention (:meth:`Eagle3Draft.compile_steps`) meet the eager references
only in tests, at test shapes, on a CPU where flex is itself a dense reference. On an H100, Kimi-width drafts
(attention head dims 112 and 192, not powers of two) trained to 0.36 accuracy at the second draft position
while SGLang's class, drafting with the same weights, accepted 0.01 there; drafts of 128-dim heads did not
show this (``benchmarks/results/kimi-h100-2026-12-07-s26/``). A wrong kernel trains a draft for a model
nobody serves, without an error. So each CUDA run measures its own kernels once: one TTT unroll of a seeded
random batch through the compiled kernels and through the eager ones (same weights, same bf16 autocast as a
training step), forward and gradients. Attention that disagrees is replaced by the dense reference; step
blocks that disagree go back to eager. The errors are in the run report either way (``attention``).
On an H100 the compiled blocks fail it at every shape, on the bf16 gradients of the q/k projections alone
(their forward equals SGLang's class, and eager in fp32), so CUDA runs train on the eager blocks
(``benchmarks/results/kernels-h100-2026-12-08-s28/``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from eaglebox.train.ttt import note_attention, ttt_attention, ttt_steps

ATTENTION_TOL = 0.1
"""Largest per-row relative error of an attention output, or relative error of a q/k/v gradient, accepted
from flex against the dense reference. Two correct bf16 kernels differ by about 1e-2 (gradients, through the
softmax's cancellations, by a few times that); a key the kernel drops or adds moves a row by O(1)."""
STEP_TOL = 0.15
"""The same for the unroll's normed outputs and the weight gradients, compiled blocks against eager ones:
rounding compounds over the steps."""
CHECK_TOKENS = 128
"""Sequence length of the check: one flex block (a 128-token sparse block; the diagonal keys of later
steps are in every row of it)."""


def row_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest relative error of a row (the last dimension)."""
    g, w = got.float(), want.float()
    return float(((g - w).norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-6)).max())


def tensor_error(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.float(), want.float()
    return float((g - w).norm() / w.norm().clamp_min(1e-12))


def eager(model) -> SimpleNamespace:
    """The model's eager reference kernels, on its own weights: what :func:`ttt_steps` calls."""
    cls = type(model)
    return SimpleNamespace(token_proj=model.token_proj, qkv=cls.qkv.__get__(model),
                           finish=cls.finish.__get__(model), attention=ttt_attention)


def attention_error(model, w: dict, ids: torch.Tensor, h: torch.Tensor, steps: int) -> float:
    """The model's attention kernel against the dense reference on each step's own q/k/v (from the eager
    blocks): the worse of the output's row error and the q/k/v gradients' errors."""
    ref, worst = eager(model), 0.0
    valid = torch.ones_like(ids, dtype=torch.bool)
    tok = model.token_proj(w, ids, steps)
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    keys, values = [], []
    for i in range(steps):
        q, k, v = (x.detach() for x in ref.qkv(w, tok[:, i : i + ids.shape[1]], h, positions + i))
        keys.append(k)
        values.append(v)
        outs, grads = [], []
        for fn in (model.attention, ttt_attention):
            args = [q.clone().requires_grad_(), [x.clone().requires_grad_() for x in keys],
                    [x.clone().requires_grad_() for x in values]]
            out = fn(args[0], args[1], args[2], valid, steps)
            cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(i)).to(out)
            inputs = [args[0], *args[1], *args[2]]
            got = torch.autograd.grad((out * cot).sum(), inputs, allow_unused=True)
            grads.append([torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got)])
            outs.append(out.detach())
        worst = max(worst, row_error(*outs), *(tensor_error(a, b) for a, b in zip(*grads)))
        with torch.no_grad():
            h, _ = ref.finish(w, h, outs[1])
    return worst


def unroll(kernels, model, dtype: torch.dtype, ids: torch.Tensor, h: torch.Tensor, steps: int):
    """One TTT unroll through ``kernels`` on ``model``'s weights cast to ``dtype`` (under the caller's autocast),
    and its backward from seeded cotangents: each step's normed output, and each trainable weight's gradient
    (None where unused)."""
    params = [p for p in model.parameters() if p.requires_grad]
    normed = ttt_steps(kernels, model.step_weights(dtype), ids, h.to(dtype), torch.ones_like(ids, dtype=torch.bool),
                       steps)
    cot = [torch.randn(x.shape, generator=torch.Generator().manual_seed(i)).to(x) for i, x in enumerate(normed)]
    grads = torch.autograd.grad(sum((x * c).sum() for x, c in zip(normed, cot)), params, allow_unused=True)
    return [x.detach() for x in normed], grads


def unroll_errors(model, got: tuple, want: tuple) -> dict[str, float]:
    """Two :func:`unroll` results compared per tensor: each step's normed output (row error) and each weight's
    gradient, keyed ``output of step i`` / ``gradient of NAME``."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    errors = {f"output of step {i}": row_error(a, b) for i, (a, b) in enumerate(zip(got[0], want[0]))}
    errors |= {f"gradient of {n}": tensor_error(torch.zeros_like(b) if a is None else a,
                                                torch.zeros_like(a) if b is None else b)
               for n, a, b in zip(names, got[1], want[1]) if a is not None or b is not None}
    return errors


def steps_errors(model, dtype: torch.dtype, ids: torch.Tensor, h: torch.Tensor, steps: int) -> dict[str, float]:
    """The model's kernels against the eager ones over the whole unroll, per tensor (:func:`unroll_errors`)."""
    return unroll_errors(model, unroll(model, model, dtype, ids, h, steps), unroll(eager(model), model, dtype, ids, h, steps))


def worst(errors: dict[str, float], n: int = 3) -> dict[str, float]:
    """The ``n`` largest of :func:`steps_errors`, rounded: where a disagreement sits (a forward block, or
    one weight's gradient)."""
    return {k: round(v, 5) for k, v in sorted(errors.items(), key=lambda kv: -kv[1])[:n]}


def check_inputs(model, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The check's seeded random batch: token ids [1, CHECK_TOKENS] and step 0's ``h`` (float32) on ``device``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.spec.vocab_size, (1, CHECK_TOKENS), generator=g).to(device)
    return ids, torch.randn(1, CHECK_TOKENS, model.spec.hidden_size, generator=g).to(device)


def check_kernels(model, steps: int, device: torch.device, seed: int = 0) -> dict:
    """Measure ``model``'s training kernels against the eager references on ``device`` (bf16 autocast on
    CUDA), replace the ones that disagree, note the result for the run report and return it."""
    ids, h = check_inputs(model, device, seed)
    cuda = device.type == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=cuda):
        dtype = torch.bfloat16 if cuda else torch.float32
        h = h.to(dtype)
        result = {"tokens": CHECK_TOKENS,
                  "attention_error": round(attention_error(model, model.step_weights(dtype), ids, h, steps), 5)}
        if result["attention_error"] > ATTENTION_TOL:
            model.attention = ttt_attention
            result["attention"] = f"replaced by the dense reference (off it by more than {ATTENTION_TOL})"
            note_attention(device, kernel="eager", reason=result["attention"])
        errors = steps_errors(model, dtype, ids, h, steps)
        result["steps_error"] = round(max(errors.values()), 5)
        result["steps_worst"] = worst(errors)
        if result["steps_error"] > STEP_TOL:
            for name in ("qkv", "finish"):
                model.__dict__.pop(name, None)  # compiled instance attributes: the class's eager methods return
            result["steps"] = f"compiled blocks replaced by the eager ones (off them by more than {STEP_TOL})"
    note_attention(device, check=result)
    print(f"train: kernels on {device} against the eager references: attention off by {result['attention_error']}"
          f" (limit {ATTENTION_TOL}), steps by {result['steps_error']} (limit {STEP_TOL}; worst {result['steps_worst']})"
          + "".join(f"; {k}: {result[k]}" for k in ("attention", "steps") if k in result), flush=True)
    return result
