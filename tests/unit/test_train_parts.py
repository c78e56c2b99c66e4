"""Trainer parts on small tensors: vocabulary maps, data order, TTT attention masks."""

import torch

from eaglebox.train.data import batch_indices
from eaglebox.train.model import shift_left, ttt_attention
from eaglebox.train.vocab import build_vocab


def test_draft_vocab_takes_most_frequent_with_id_tiebreak_and_sglang_offsets():
    counts = torch.tensor([0, 5, 3, 5, 1, 9])
    d2t, t2d = build_vocab(counts, 3)
    assert t2d.tolist() == [False, True, False, True, False, True]
    # SGLang: hot_token_id = d2t + arange -> the target ids, ascending
    assert (d2t + torch.arange(3)).tolist() == [1, 3, 5]


def test_global_batch_is_independent_of_the_number_of_ranks():
    one = batch_indices(40, seed=3, epoch=1, step_in_epoch=2, world=1, rank=0, batch_size=8)
    two = [batch_indices(40, seed=3, epoch=1, step_in_epoch=2, world=2, rank=r, batch_size=4) for r in range(2)]
    assert one == two[0] + two[1]
    assert batch_indices(40, 3, 2, 2, 1, 0, 8) != one  # another epoch, another order


def test_shift_left_fills_the_tail():
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 2).tolist() == [[3, 4, 0, 0]]
    assert shift_left(x, 0).tolist() == [[1, 2, 3, 4]]


def test_ttt_attention_sees_causal_step0_and_its_own_diagonal_only():
    torch.manual_seed(0)
    B, Hq, Hkv, T, d = 1, 4, 2, 5, 8
    q = torch.randn(B, Hq, T, d)
    keys = [torch.randn(B, Hkv, T, d) for _ in range(3)]
    values = [torch.randn(B, Hkv, T, d) for _ in range(3)]
    out = ttt_attention(q, keys, values, torch.ones(B, T, dtype=torch.bool))
    t, h = 3, 1
    kv_h = h // 2
    ks = torch.cat([keys[0][0, kv_h, : t + 1]] + [k[0, kv_h, t : t + 1] for k in keys[1:]])
    vs = torch.cat([values[0][0, kv_h, : t + 1]] + [v[0, kv_h, t : t + 1] for v in values[1:]])
    want = torch.softmax(q[0, h, t] @ ks.T / d**0.5, -1) @ vs
    assert torch.allclose(out[0, h, t], want, atol=1e-5)
