"""Training-time test: the unrolled draft steps (:func:`ttt_forward`) and their attention kernels.

Step ``i`` at sequence index ``t`` sees the target's features at ``t``, the token ``x[t+1+i]`` and
predicts ``x[t+2+i]``; its query sits at position ``t+i`` and attends to step 0's keys at positions
``<= t`` and to its own earlier steps' keys at the same index -- what chain drafting does at
inference (SGLang step ``j`` runs at position ``q+j`` over the verified prefix and the draft tokens
before it). :func:`ttt_attention` is the eager, dense reference (the CPU path);
:func:`flex_ttt_attention` the block-sparse CUDA path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from eaglebox.train.loss import DraftHeadLoss, target_probs


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

# Flex attention's kernels by the device's shared memory per block (opt-in limit). torch's default
# Triton configs were tuned on Hopper-class parts (H100/H200: 227 KB a block): they are the H200 path
# and stay untouched. Blackwell workstation GPUs (SM120: RTX PRO 6000, RTX 5090) allow about 99 KB,
# where the default backward kernels can run out of shared memory; there the trainer asks for the
# smaller blocks torch itself suggests on that error (32/64 forward, 32 backward, one stage), and
# below SMALL_SMEM_BYTES it drops flex for the dense eager reference, :func:`ttt_attention`.
LARGE_SMEM_BYTES = 160 * 1024
SMALL_SMEM_BYTES = 64 * 1024
SMALL_SMEM_KERNEL_OPTIONS = {
    "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 64, "fwd_num_stages": 1, "fwd_num_warps": 4,
    "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 32, "bwd_BLOCK_M2": 32, "bwd_BLOCK_N2": 32,
    "bwd_num_stages": 1, "bwd_num_warps": 4,
}
_attention_choices: dict = {}


def attention_choice(smem_per_block: int | None) -> dict:
    """The TTT attention kernel for a device that reports ``smem_per_block`` bytes of shared memory
    per block (None: not reported): ``{"kernel": "flex" | "eager", "kernel_options": dict | None,
    "smem_per_block": ..., "reason": ...}``. ``kernel_options`` None means torch's defaults."""
    if smem_per_block is None or smem_per_block >= LARGE_SMEM_BYTES:
        return {"kernel": "flex", "kernel_options": None, "smem_per_block": smem_per_block,
                "reason": f"shared memory per block {smem_per_block} >= {LARGE_SMEM_BYTES} (or not reported): "
                          "torch's default flex blocks"}
    if smem_per_block >= SMALL_SMEM_BYTES:
        return {"kernel": "flex", "kernel_options": dict(SMALL_SMEM_KERNEL_OPTIONS), "smem_per_block": smem_per_block,
                "reason": f"shared memory per block {smem_per_block} < {LARGE_SMEM_BYTES}: small flex blocks"}
    return {"kernel": "eager", "kernel_options": None, "smem_per_block": smem_per_block,
            "reason": f"shared memory per block {smem_per_block} < {SMALL_SMEM_BYTES}: dense eager attention"}


def device_attention_choice(device: torch.device) -> dict:
    """:func:`attention_choice` for a CUDA device, from ``shared_memory_per_block_optin``; made once a
    device and logged (``train: attention ...``); :func:`attention_choices` returns them for the run
    report."""
    key = str(device)
    if key not in _attention_choices:
        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_block_optin", None)
        choice = attention_choice(int(smem) if smem else None)
        choice.update(device=key, name=props.name, capability=f"{props.major}.{props.minor}")
        _attention_choices[key] = choice
        print(f"train: attention {choice['kernel']} on {props.name} (sm_{props.major}{props.minor}): "
              f"{choice['reason']}", flush=True)
    return _attention_choices[key]


def note_attention(device: torch.device, **fields) -> None:
    """Add ``fields`` to ``device``'s entry of :func:`attention_choices` (:mod:`eaglebox.train.kernel_check`'s
    measurement, or the kernel it fell back to)."""
    _attention_choices.setdefault(str(device), {}).update(fields)


def attention_choices() -> dict:
    """The choices made so far, by device: what the run report records."""
    return {k: dict(v) for k, v in _attention_choices.items()}


def flex_ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                       valid: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`ttt_attention` with a block-sparse mask: step ``i`` costs a causal ``T x T`` plus ``i``
    diagonal blocks, not a dense ``T x (i+1)T``. Keys are zero-padded to all ``steps`` (blocks
    the mask skips, so no work) so that one compiled kernel serves every step. Batches are padded
    on the right, so a padding key is only ever seen by padding queries (causal and diagonal keys
    sit at or before the query) and ``valid`` needs no mask here: the block mask depends only on
    the length and the step, and is built once per pair. Compiled on CUDA, eager (a dense
    reference inside flex) elsewhere. On CUDA the kernel follows the device's shared memory per
    block (:func:`device_attention_choice`): torch's defaults on H100/H200, smaller blocks on SM120
    workstation GPUs, the dense reference below that."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    on_gpu = q.device.type == "cuda"
    choice = device_attention_choice(q.device) if on_gpu else None
    if choice is not None and choice["kernel"] == "eager":
        return ttt_attention(q, keys, values, valid, steps)
    B, Hq, T, _ = q.shape
    pad = [x[0].new_zeros(*x[0].shape[:2], (steps - len(x)) * T, x[0].shape[3]) for x in (keys, values)]
    k, v = torch.cat(keys + pad[:1], dim=2), torch.cat(values + pad[1:], dim=2)  # MLA: v narrower than k
    key = (T, steps, len(keys), q.device)
    if key not in _block_masks:
        limit = torch.tensor(len(keys) * T, device=q.device)
        _block_masks[key] = create_block_mask(ttt_mask_mod(T, limit), None, None, T, steps * T, device=q.device,
                                              _compile=on_gpu)
    if on_gpu and _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)  # see Eagle3Draft.compile_steps
    fn = _compiled_flex if on_gpu else flex_attention
    if choice is not None and choice["kernel_options"] is not None:
        return fn(q, k, v, block_mask=_block_masks[key], enable_gqa=Hq != k.shape[1],
                  kernel_options=choice["kernel_options"])
    return fn(q, k, v, block_mask=_block_masks[key], enable_gqa=Hq != k.shape[1])


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n]; the last n positions get ``fill``."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_steps(model: torch.nn.Module, w: dict, ids: torch.Tensor, h: torch.Tensor, valid: torch.Tensor,
              ttt_length: int) -> list[torch.Tensor]:
    """The unrolled draft steps from step 0's ``h`` [B, T, H] (weights ``w`` from ``step_weights``):
    each step's final-normed output [B, T, H], the lm_head's input."""
    B, T = ids.shape
    positions = torch.arange(T, device=ids.device)[None].expand(B, T)
    tok = model.token_proj(w, ids, ttt_length)
    keys, values, out = [], [], []
    for i in range(ttt_length):
        q, k, v = model.qkv(w, tok[:, i : i + T], h, positions + i)
        keys.append(k)
        values.append(v)
        h, normed = model.finish(w, h, model.attention(q, keys, values, valid, ttt_length))
        out.append(normed)
    return out


def ttt_forward(model: torch.nn.Module, batch: dict, lm_head_weight: torch.Tensor,
                ttt_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed losses, correct top-1 counts and scored positions, each [ttt_length], for a padded batch
    through ``model`` (an :class:`~eaglebox.train.model.Eagle3Draft`: its step blocks and kernels).

    batch: ``input_ids`` [B, T], ``loss_mask`` [B, T], ``aux`` [B, T, k*Ht], ``last`` [B, T, Ht],
    ``valid`` [B, T] (False on padding). Sums, not means: the caller normalises after summing over
    ranks, so the result does not depend on how the data was split.
    """
    ids, valid = batch["input_ids"], batch["valid"]
    T = ids.shape[1]
    probs, in_vocab = target_probs(batch["last"], lm_head_weight, model.d2t, model.t2d)
    # index t predicts x[t+2+i] (an assistant token) from the target's distribution at t+1+i (whose
    # argmax lies in the draft vocabulary)
    scored = batch["loss_mask"].bool() & valid
    h = model.project_aux(batch["aux"])
    dtype = torch.get_autocast_dtype(ids.device.type) if torch.is_autocast_enabled(ids.device.type) else h.dtype
    w = model.step_weights(dtype)
    normed = ttt_steps(model, w, ids, h.to(dtype), valid, ttt_length)
    rows = [x[:, : T - 1 - i] for i, x in enumerate(normed)]  # rows t whose target distribution (at t+1+i) exists
    masks = [shift_left(scored, 2 + i, False)[:, : T - 1 - i] & in_vocab[:, 1 + i :] for i in range(ttt_length)]
    losses, correct = DraftHeadLoss.apply(w["lm_head"], probs, probs.argmax(-1), masks, model.head_chunk, *rows)
    return losses, correct, torch.stack([m.sum() for m in masks])
