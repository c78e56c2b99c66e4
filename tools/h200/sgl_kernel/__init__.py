"""A torch stand-in for ``sgl_kernel`` on the lent H200, where the real sglang-kernel 0.4.10 cannot load
(it is built against torch 2.14.1; the machine has torch 2.11).

It exposes exactly the names the real package exports, module by module (read from the real wheel by
``build_carry.sh`` into ``sgl_kernel_names.json``), so SGLang's ``try: from sgl_kernel import X`` sees
the same names as with the real package. The few a Llama forward calls on CUDA are torch code below;
the two a DeepSeek-V3 MoE layer calls there through ``sglang.kernels`` (``moe_align_block_size``,
``moe_sum_reduce``) too; every other name is a stub that raises when called, naming itself. ``scalar_type`` is the real module,
copied from the wheel next to this file at run time. Kernels here are slow and not the production
ones: timings on this stack say nothing about SGLang's real kernels.
"""

import json
import os
import sys
import types

import torch

__version__ = "0.4.10"


def _rms(x, w, eps, gemma):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (w.float() + 1 if gemma else w.float())).to(x.dtype)


def _into(result, out):
    if out is None:
        return result
    out.copy_(result)
    return out


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(_rms(input, weight, eps, False), out)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(_rms(input, weight, eps, True), out)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, False))


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, True))


def _gated(fn, input, out):
    d = input.shape[-1] // 2
    return _into((fn(input[..., :d].float()) * input[..., d:].float()).to(input.dtype), out)


def silu_and_mul(input, out=None, enable_pdl=None):
    return _gated(torch.nn.functional.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _gated(torch.nn.functional.gelu, input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _gated(lambda t: torch.nn.functional.gelu(t, approximate="tanh"), input, out)


def weak_ref_tensor(tensor):
    return tensor


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    cs = cos_sin_cache[positions.long()].float()
    rd = cs.shape[-1]
    cos, sin = cs[..., : rd // 2].unsqueeze(1), cs[..., rd // 2 :].unsqueeze(1)
    for t in (query, key):
        if t is None:
            continue
        v = t.view(positions.numel(), -1, head_size)
        r = v[..., :rd].float()
        if is_neox:
            x1, x2 = r[..., : rd // 2], r[..., rd // 2 :]
            o = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            o = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
        v[..., :rd] = o.to(t.dtype)


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         cumsum_buffer, pad_sorted_token_ids=False, ignore_invalid_expert=False):
    """SGLang's "+1 offset" contract (``moe_align_small_numel`` is its Triton statement): expert ``e`` is
    bucket ``e + 1`` (-1, filtered, is bucket 0 and its blocks get expert id -1), each bucket padded to a
    multiple of ``block_size`` in bucket order, pad slots hold ``numel``; the order within a bucket is the
    pairs' own (fused_moe reads each row's pair index, not its rank). No host sync: CUDA graphs capture it."""
    if ignore_invalid_expert:
        raise NotImplementedError("sgl_kernel.moe_align_block_size(ignore_invalid_expert=True): not in the stand-in")
    bucket = topk_ids.flatten().long() + 1
    numel = bucket.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=bucket.device).index_add_(
        0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    order = torch.argsort(bucket, stable=True)
    rank = torch.arange(numel, device=bucket.device) - (counts.cumsum(0) - counts)[bucket[order]]
    sorted_token_ids.fill_(numel)
    sorted_token_ids.scatter_(0, (ends - padded)[bucket[order]] + rank, order.to(sorted_token_ids.dtype))
    starts = torch.arange(experts_ids.numel(), device=bucket.device) * block_size
    owner = torch.searchsorted(ends, starts, right=True).clamp_max(num_experts - 1)
    experts_ids.copy_(owner - 1)
    num_tokens_post_pad[:1].copy_(ends[-1:])
    cumsum_buffer[: num_experts + 1].copy_(torch.cat([ends.new_zeros(1), ends]))


def moe_sum_reduce(input, output, routed_scaling_factor):
    """The top-k experts' outputs of each token ([tokens, topk, hidden]) summed and scaled."""
    output.copy_((input.float().sum(1) * routed_scaling_factor).to(output.dtype))


def is_arch_support_pdl():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


_IMPLEMENTED = {f.__name__: f for f in (rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm,
                                        silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, weak_ref_tensor,
                                        rotary_embedding, moe_align_block_size, moe_sum_reduce,
                                        is_arch_support_pdl)}
_NAMES: dict[str, list[str]] = json.loads(open(os.environ["EAGLEBOX_SGLK_NAMES"]).read())


def _stub(qualname):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{qualname}: not in eaglebox's torch stand-in for sgl_kernel")
    stub.__name__ = qualname.rsplit(".", 1)[-1]
    return stub


def _resolver(module: str):
    names = set(_NAMES.get(module, ()))

    def __getattr__(name):
        if name in names:
            return _IMPLEMENTED.get(name) or _stub(f"{module}.{name}")
        raise AttributeError(f"module {module!r} has no attribute {name!r} (the real one has none either)")
    return __getattr__


__getattr__ = _resolver("sgl_kernel")
for _module in _NAMES:  # the real package's submodules, as modules whose names resolve like the real ones
    if _module != "sgl_kernel" and _module != "sgl_kernel.scalar_type":
        _m = types.ModuleType(_module)
        _m.__getattr__ = _resolver(_module)
        _m.__path__ = []  # a package, for sgl_kernel.quantization.gguf and the like
        sys.modules[_module] = _m
