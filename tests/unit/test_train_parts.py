"""Trainer parts on small tensors: vocabulary maps, data order, TTT attention masks, the fused loss,
compiled steps, the shard-header check."""

import pytest
import torch

from conftest import small_spec
from eaglebox.draft.spec import DraftSpec
from eaglebox.errors import EagleboxError
from eaglebox.shards.spec import NOT_INSTALLED
from eaglebox.target.fingerprint import ALGORITHM
from eaglebox.train.data import batch_indices
from eaglebox.train.loop import check_header
from eaglebox.train.loss import DraftHeadLoss, head_chunk
from eaglebox.train.model import PAD_MULTIPLE, Eagle3Draft
from eaglebox.train.ttt import flex_ttt_attention, shift_left, ttt_attention, ttt_forward
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


def test_flex_attention_equals_the_dense_reference_with_padding():
    """Forward only: flex attention has no CPU backward; benchmarks/train_throughput.py checks the
    gradients of the whole compiled CUDA path against the reference on the GPU."""
    torch.manual_seed(0)
    B, Hq, Hkv, T, d = 2, 4, 2, 136, 16  # T past one 128-row block, so the block mask is really sparse
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 100:] = False
    q = torch.randn(B, Hq, T, d)
    keys = [torch.randn(B, Hkv, T, d) for _ in range(3)]
    values = [torch.randn(B, Hkv, T, d) for _ in range(3)]
    dense = ttt_attention(q, keys, values, valid)
    flex = flex_ttt_attention(q, keys, values, valid, 5)  # keys padded to 5 steps, masked out
    real = valid[:, None, :, None].expand_as(dense)  # padded queries are never scored
    assert torch.allclose(dense[real], flex[real], atol=1e-5)


def test_fused_head_loss_equals_autograd_of_the_plain_loss():
    """Three TTT steps of different lengths, weighted as the trainer weights them."""
    torch.manual_seed(0)
    B, H, V, T = 2, 8, 11, 12
    xs = [torch.randn(B, T - 1 - i, H, requires_grad=True) for i in range(3)]
    w = torch.randn(V, H, requires_grad=True)
    p = torch.randn(B, T, V).softmax(-1)
    masks = [torch.rand(B, T - 1 - i) > 0.3 for i in range(3)]
    weights = torch.tensor([1.0, 0.8, 0.64])
    loss, correct = DraftHeadLoss.apply(w, p, p.argmax(-1), masks, head_chunk, *xs)
    got = torch.autograd.grad((weights * loss).sum(), [w, *xs])
    want_loss, want_correct = [], []
    for i, (x, m) in enumerate(zip(xs, masks)):
        logp = (x @ w.T).log_softmax(-1)
        pt = p[:, 1 + i : 1 + i + x.shape[1]]
        want_loss.append(-(pt * logp).sum(-1)[m].sum())
        want_correct.append(((logp.argmax(-1) == pt.argmax(-1)) & m).sum())
    want = torch.autograd.grad((weights * torch.stack(want_loss)).sum(), [w, *xs])
    assert torch.allclose(loss, torch.stack(want_loss), atol=1e-5)
    assert correct.tolist() == torch.stack(want_correct).tolist()
    assert all(torch.allclose(g, r, atol=1e-5) for g, r in zip(got, want))


def test_compiled_steps_keep_one_static_entry_per_padded_length_past_torchs_limit(monkeypatch):
    """Three lengths, one more than a recompile limit of 2 (torch's default of 8 took nine lengths, each compiled
    twice: docs/testing.md): every length is compiled static (none turned dynamic, none left to run eagerly) and
    computes what the eager draft does."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    torch._dynamo.reset()
    torch.manual_seed(0)
    spec = DraftSpec(hidden_size=32, target_hidden_size=32, num_aux=3, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=16, intermediate_size=64, vocab_size=100, draft_vocab_size=40, rms_norm_eps=1e-5,
                     rope_theta=10000.0, rope_scaling=None, max_position_embeddings=2048)
    eager = Eagle3Draft(spec)
    with torch.no_grad():
        eager.d2t.copy_(build_vocab(torch.arange(100), 40)[0])
    compiled = Eagle3Draft(spec)
    compiled.load_state_dict(eager.state_dict())
    lengths = [k * PAD_MULTIPLE for k in range(1, 4)]
    compiled.compile_steps(max(lengths))
    head = torch.randn(100, 32)
    for T in lengths:
        batch = {"input_ids": torch.randint(0, 100, (1, T)), "loss_mask": torch.ones(1, T, dtype=torch.bool),
                 "valid": torch.ones(1, T, dtype=torch.bool), "aux": torch.randn(1, T, 96), "last": torch.randn(1, T, 32)}
        with torch.no_grad():
            want, got = ttt_forward(eager, batch, head, 2), ttt_forward(compiled, batch, head, 2)
        assert torch.allclose(want[0], got[0], rtol=1e-4) and torch.equal(want[1], got[1])
    for fn in (Eagle3Draft.qkv, Eagle3Draft.finish):
        entries = _debug_get_cache_entry_list(fn.__code__)
        assert len(entries) == len(lengths), fn.__name__


def test_training_where_sglang_is_absent_is_refused_naming_the_captured_version(tmp_path):
    """Without SGLang installed there is no serving engine to check the shards against."""
    target = {"config_sha256": "ab", "tokenizer_sha256": "ab", "weights_digest": "cd", "weights_algorithm": ALGORITHM}
    header = small_spec(target=target)
    check_header(header, header, tmp_path)
    with pytest.raises(EagleboxError, match=r"captured with SGLang 0\.5\.23, and SGLang is not installed here"):
        check_header(header, small_spec(target=target, engine_version=NOT_INSTALLED), tmp_path)
    other = small_spec(target={**target, "weights_digest": "ef"})
    with pytest.raises(EagleboxError, match=r"shards have target.weights_digest='cd', the config implies 'ef'"):
        check_header(header, other, tmp_path)
