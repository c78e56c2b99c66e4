"""Torch versions of the ``sgl_kernel`` functions that SGLang 0.5.23's CPU engine calls.

The PyPI ``sglang-kernel`` wheel is CUDA-only and cannot be imported without a driver. On a CPU
without Intel AMX, SGLang runs the model in plain torch and calls only these helpers: KV-pool
copies, request-to-token bookkeeping and, for speculative decoding, EAGLE tree building and greedy
verification. Each follows the semantics of SGLang's own Triton kernel of the same job
(``sglang/kernels/ops/...``); the tests compare them with those kernels run by Triton's interpreter.

Test and CPU-demo support only: GPU images use the real kernels. Batches on CPU are small, so the
per-request loops stay readable rather than vectorised.
"""

from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For every KV buffer (base address ``data_ptrs[b]``, ``strides[b]`` bytes a row) copy row
    ``src_loc[i]`` to row ``tgt_loc[i]``. All source rows are read before any is written, as the
    Triton kernel's load-then-store does, so overlapping moves are safe."""
    src, tgt = src_loc.tolist(), tgt_loc.tolist()
    if not src:
        return
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """``req_to_token[r, start:end] = out_cache_loc[next n slots]`` for each request, in order."""
    off = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = max(e - s, 0)
        req_to_token[r, s : s + n] = out_cache_loc[off : off + n].to(req_to_token.dtype)
        off += n


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """The inverse gather: ``out_cache_loc[next n slots] = req_to_token[r, start:end]``."""
    off = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = max(e - s, 0)
        out_cache_loc[off : off + n] = req_to_token[r, s : s + n].to(out_cache_loc.dtype)
        off += n


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                           pool_len: int, topk: int, num_cols: int) -> None:
    """Each request's ``topk * num_cols`` slots from ``seq_lens[i]`` on, packed request by request."""
    n = topk * num_cols
    for i, (r, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[r, s : s + n].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride: int) -> None:
    """``bonus_tokens[i]`` = the last accepted token of request ``i``."""
    flat = accept_tokens.reshape(-1)
    for i, a in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + a - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Compact the cache slots of accepted tokens (``accept_index != -1``) to the front."""
    idx = accept_index.reshape(-1)
    idx = idx[idx != -1].long()
    accept_out_cache_loc[: idx.numel()] = out_cache_loc[idx].to(accept_out_cache_loc.dtype)


def _parent_pos(sel: list[int], parents: list[int], topk: int, n: int, i: int) -> int | None:
    """Position (0 = root, j = draft token j) of draft token ``i``'s parent; None if not in the tree."""
    ptb = sel[i - 1] // topk
    if ptb == 0:
        return 0
    candidates = sel[: n - 1]
    return candidates.index(parents[ptb]) + 1 if parents[ptb] in candidates else None


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrieve_index, retrieve_next_token, retrieve_next_sibling,
                                    topk: int, depth: int, draft_token_num: int, tree_mask_mode: int = 0) -> None:
    """Build the EAGLE draft tree: sibling/child links, the attention mask and token positions.

    Token 0 of each request is the verified token; token ``i > 0`` is draft candidate
    ``selected_index[b, i-1]`` whose parent is found through ``parent_list``.
    """
    if int(tree_mask_mode) == 2:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not built on CPU")
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    prefix = 0
    mask = tree_mask.view(-1)
    for b, seq_len in enumerate(seq_lens):
        sel = selected_index[b].tolist()
        parents = parent_list[b].tolist() if parent_list.dim() > 1 else parent_list.tolist()

        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = b * n + i
            p = _parent_pos(sel, parents, topk, n, i)
            if p is not None:
                prev = int(retrieve_next_token[b, p])
                retrieve_next_token[b, p] = i
                if prev != -1:
                    retrieve_next_sibling[b, i] = prev
        retrieve_index[b, 0] = b * n
        base = n * n * b + prefix * n if int(tree_mask_mode) == 0 else None
        for t in range(n):
            if base is not None:
                row = base + (seq_len + n) * t + seq_len + 1
            else:
                row = n * n * b + n * t + 1
            mask[row - 1] = True
            mask[row : row + n - 1] = False
            if t == 0:
                continue
            cur, depth_t = t - 1, 0
            for _ in range(depth):
                depth_t += 1
                mask[row + cur] = True
                p = _parent_pos(sel, parents, topk, n, cur + 1)
                if p is None or p == 0:
                    break
                cur = p - 1
            positions[b * n + t] = depth_t + seq_len
        prefix += seq_len


def verify_tree_greedy_cpu(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """Greedy verification: walk the tree from the root, at each level accept the child whose token
    equals the target's greedy token, stop at the first level with no match; the target's token at
    the last accepted node becomes the bonus token."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    tp = target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            target = int(tp[last])
            while cur != -1 and int(candidates[b, cur]) != target:
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
            predicts[last] = target
            accepted += 1
            last = int(retrive_index[b, cur])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = tp[last]


CPU_KERNELS = [name for name in list(globals()) if name.endswith("_cpu")]
"""The names the ``sgl_kernel`` stand-in exports; any other name raises ImportError there."""
