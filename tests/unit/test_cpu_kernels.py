"""The torch stand-ins for sgl_kernel, against plain references and SGLang's own Triton kernels
(run by Triton's CPU interpreter in a subprocess, since TRITON_INTERPRET must be set before import)."""

import json
import os
import subprocess
import sys

import torch

from eaglebox_dev import cpu_kernels as k


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer_even_when_overlapping():
    bufs = [torch.arange(40, dtype=torch.float32).reshape(10, 4), torch.arange(60, dtype=torch.bfloat16).reshape(10, 6)]
    want = [b.clone() for b in bufs]
    src, tgt = torch.tensor([1, 2, 3]), torch.tensor([2, 3, 7])  # row 2 and 3 are read and written
    for w in want:
        w[tgt] = w[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    k.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, w in zip(bufs, want):
        assert torch.equal(b, w)


def test_req_to_token_assign_and_gather_are_inverse():
    pool = torch.zeros(3, 16, dtype=torch.int32)
    locs = torch.arange(100, 107, dtype=torch.int64)
    req, start, end = torch.tensor([2, 0]), torch.tensor([4, 0]), torch.tensor([8, 3])
    k.assign_req_to_token_pool_cpu(req, pool, start, end, locs, 16)
    assert pool[2, 4:8].tolist() == [100, 101, 102, 103] and pool[0, :3].tolist() == [104, 105, 106]
    assert pool.sum() == sum(range(100, 107))
    out = torch.full((7,), -1, dtype=torch.int64)
    k.assign_extend_cache_locs_cpu(req, pool, start, end, out, 16)
    assert torch.equal(out, locs)


def test_draft_cache_locs_bonus_tokens_and_accept_compaction():
    pool = torch.arange(48, dtype=torch.int32).reshape(3, 16)
    out = torch.empty(8, dtype=torch.int64)
    k.assign_draft_cache_locs_contiguous_cpu(torch.tensor([1, 2]), pool, torch.tensor([5, 0]), out, 16, 1, 4)
    assert out.tolist() == [21, 22, 23, 24, 32, 33, 34, 35]
    bonus = torch.empty(2, dtype=torch.int64)
    k.fill_bonus_tokens_cpu(torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]]), torch.tensor([3, 1]), bonus, 4)
    assert bonus.tolist() == [9, 11]
    acc = torch.full((6,), -9, dtype=torch.int64)
    k.fill_accept_out_cache_loc_cpu(torch.tensor([[0, 2, -1], [3, -1, -1]]), torch.tensor([50, 51, 52, 53]), acc)
    assert acc[:3].tolist() == [50, 52, 53] and acc[3:].tolist() == [-9] * 3


def test_verify_greedy_chain_all_none_and_first_miss():
    # one chain of 4 tokens (root + 3 drafts), topk 1: next_token i -> i+1, no siblings
    def run(cands, target):
        bs, n = 1, 4
        predicts = torch.full((n,), -1, dtype=torch.int64)
        accept_index = torch.full((bs, n), -1, dtype=torch.int64)
        accept_num = torch.zeros(bs, dtype=torch.int64)
        k.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                                 candidates=torch.tensor([cands]), retrive_index=torch.tensor([[0, 1, 2, 3]]),
                                 retrive_next_token=torch.tensor([[1, 2, 3, -1]]),
                                 retrive_next_sibling=torch.full((1, 4), -1), target_predict=torch.tensor([target]))
        return accept_num.item(), accept_index[0].tolist(), predicts.tolist()

    # target greedy after each node: root->5, 5->6, 6->7, 7->8
    assert run([4, 5, 6, 7], [5, 6, 7, 8]) == (3, [0, 1, 2, 3], [5, 6, 7, 8])
    assert run([4, 9, 6, 7], [5, 6, 7, 8]) == (0, [0, -1, -1, -1], [5, -1, -1, -1])
    assert run([4, 5, 9, 7], [5, 6, 7, 8]) == (1, [0, 1, -1, -1], [5, 6, -1, -1])


REFERENCE = r"""
import json, sys, torch
from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton, verify_tree_greedy_triton
from eaglebox_dev import cpu_kernels as k
torch.manual_seed(0)
results = []
for case in range(12):
    bs, topk, depth = 2, [1, 2, 4][case % 3], 3
    n = [4, 6, 8][case % 3]
    seq = torch.tensor([5, 9])[:bs]
    plen = topk * (depth - 1) + 1
    parent = torch.randint(0, topk * plen, (bs, plen))
    sel = torch.stack([torch.randperm(topk * plen)[: n - 1] for _ in range(bs)])
    outs = []
    for impl in ("triton", "torch"):
        mask = torch.ones(int(n * n * bs + seq.sum() * n), dtype=torch.bool)
        pos = torch.zeros(bs * n, dtype=torch.int64)
        ri = torch.full((bs, n), -1, dtype=torch.int64)
        rn = torch.full((bs, n), -1, dtype=torch.int64)
        rs = torch.full((bs, n), -1, dtype=torch.int64)
        args = (parent, sel, seq, mask, pos, ri, rn, rs, topk, depth, n, 0)
        (sgl_build_tree_kernel_triton if impl == "triton" else k.build_tree_kernel_efficient_cpu)(*args)
        cands = torch.randint(0, 3, (bs, n))
        target = torch.randint(0, 3, (bs, n))
        pr = torch.full((bs * n,), -1, dtype=torch.int64)
        ai = torch.full((bs, depth + 1), -1, dtype=torch.int64)
        an = torch.zeros(bs, dtype=torch.int64)
        torch.manual_seed(100 + case)
        cands = torch.randint(0, 3, (bs, n)); target = torch.randint(0, 3, (bs, n))
        if impl == "triton":
            verify_tree_greedy_triton(pr, ai, an, cands, ri, rn, rs, target)
        else:
            k.verify_tree_greedy_cpu(predicts=pr, accept_index=ai, accept_token_num=an, candidates=cands,
                                     retrive_index=ri, retrive_next_token=rn, retrive_next_sibling=rs,
                                     target_predict=target)
        outs.append([t.tolist() for t in (mask, pos, ri, rn, rs, pr, ai, an)])
    results.append(outs[0] == outs[1])
print(json.dumps(results))
"""


def test_tree_build_and_verify_match_sglang_triton_kernels():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", REFERENCE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    same = json.loads(out.stdout.strip().splitlines()[-1])
    assert same == [True] * 12


MLA_DECODE = r"""
import json, torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from eaglebox_dev.cpu_patches import mla_decode_attention
torch.manual_seed(0)
worst = 0.0
for lk, lv, seqs in ((288, 256, [7, 60, 33]), (576, 512, [5, 40])):  # the tiny target's and Kimi's latent widths
    B, H, splits = len(seqs), 4, 8
    q, kb = torch.randn(B, H, lk), torch.randn(200, 1, lk)
    indptr = torch.tensor([0] + seqs).cumsum(0).to(torch.int32)
    indices = torch.randperm(200)[: sum(seqs)].to(torch.int32)
    ref, ours = torch.zeros(B, H, lv), torch.zeros(B, H, lv)
    decode_attention_fwd(q, kb, kb[..., :lv], ref, indptr, indices, torch.empty(B, H, splits, lv),
                         torch.empty(B, H, splits), torch.full((B,), splits, dtype=torch.int32), splits, 0.07, 1.0,
                         1.0, has_mla=True)
    mla_decode_attention(q, kb, ours, indptr, indices, 0.07)
    worst = max(worst, (ref - ours).abs().max().item())
print(json.dumps(worst))
"""


def test_torch_mla_decode_matches_sglang_triton_decode_kernel():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", MLA_DECODE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) < 1e-5
