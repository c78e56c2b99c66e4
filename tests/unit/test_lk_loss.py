"""The LK^alpha loss (``train.loss=lk_alpha``, arXiv 2602.23881): its chunk against the naive expression
and autograd, and a real training run on the CPU that lowers it."""

from __future__ import annotations

import json
import math

import torch

from conftest import config_for_model
from eaglebox.train.loss import ALPHA_FLOOR, DraftHeadLoss, head_chunk, lk_alpha_chunk


def naive_lk(z: torch.Tensor, p: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """-log sum_v min(p_v, softmax(z)_v), summed over the rows under mask ``m``."""
    return -(torch.minimum(p, z.softmax(-1)).sum(-1).log() * m).sum()


def test_lk_chunk_equals_the_naive_loss_and_its_autograd_gradient_in_float64():
    g = torch.Generator().manual_seed(0)
    R, V = 13, 37
    z = (3 * torch.randn(R, V, generator=g, dtype=torch.float64)).requires_grad_()
    p = (2 * torch.randn(R, V, generator=g, dtype=torch.float64)).softmax(-1)
    m = torch.rand(R, generator=g) > 0.3
    m[0], m[1] = False, True
    loss, correct, grad = lk_alpha_chunk(z.detach(), p, p.argmax(-1), m)
    assert grad.dtype == torch.float64
    want = naive_lk(z, p, m.double())
    (want_grad,) = torch.autograd.grad(want, z)
    assert torch.allclose(loss.double(), want, rtol=1e-6)
    assert torch.allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    assert torch.all(grad[~m] == 0) and grad[m].abs().sum() > 0
    assert correct == ((z.argmax(-1) == p.argmax(-1)) & m).sum()  # top-1 hits counted as head_chunk counts them
    assert correct == head_chunk(z.detach(), p, p.argmax(-1), m)[1]

    # masked rows add nothing, however far the draft is from the target there
    only_masked = lk_alpha_chunk(z.detach(), p, p.argmax(-1), torch.zeros(R, dtype=torch.bool))
    assert only_masked[0] == 0 and only_masked[1] == 0 and torch.all(only_masked[2] == 0)


def test_lk_chunk_stays_finite_where_the_draft_misses_the_targets_support():
    """alpha rounds to 0 in float32 when q sits where p has no mass: the floor keeps loss and gradient finite."""
    V = 8
    z = torch.full((2, V), -200.0)
    z[:, 0] = 200.0  # all of q on token 0
    p = torch.zeros(2, V)
    p[:, 1] = 1.0  # all of p on token 1
    loss, _, grad = lk_alpha_chunk(z, p, p.argmax(-1), torch.tensor([True, False]))
    assert math.isclose(float(loss), -math.log(ALPHA_FLOOR), rel_tol=1e-6)
    assert torch.isfinite(grad).all()


def test_lk_through_the_fused_head_equals_autograd_of_the_plain_loss():
    """The LK chunk in :class:`DraftHeadLoss` (lm_head fused, three TTT steps, the trainer's weights)."""
    torch.manual_seed(0)
    B, H, V, T = 2, 8, 11, 12
    xs = [torch.randn(B, T - 1 - i, H, dtype=torch.float64, requires_grad=True) for i in range(3)]
    w = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    p = torch.randn(B, T, V, dtype=torch.float64).softmax(-1)
    masks = [torch.rand(B, T - 1 - i) > 0.3 for i in range(3)]
    weights = torch.tensor([1.0, 0.8, 0.64], dtype=torch.float64)
    loss, _ = DraftHeadLoss.apply(w, p, p.argmax(-1), masks, lk_alpha_chunk, *xs)
    got = torch.autograd.grad((weights * loss).sum(), [w, *xs])
    want_loss = torch.stack([naive_lk(x @ w.T, p[:, 1 + i : 1 + i + x.shape[1]], m.double())
                             for i, (x, m) in enumerate(zip(xs, masks))])
    want = torch.autograd.grad((weights * want_loss).sum(), [w, *xs])
    assert torch.allclose(loss.double(), want_loss, rtol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-8) for a, b in zip(got, want))


def write_shards(out, staging, spec, samples: list[list[int]], shard_size: int) -> None:
    """``samples`` captured through the real capture sink (random features) and committed as the
    extract client commits them (as ``tests/unit/test_verified_reads.py`` does)."""
    from eaglebox.capture.sink import CaptureSink
    from eaglebox.extract.commit import commit_shard
    from eaglebox.extract.plan import Planned
    from eaglebox.shards.format import FORMAT, save_manifest

    H, k = spec.hidden_size, len(spec.layers.layer_ids)
    g = torch.Generator().manual_seed(1)
    sink = CaptureSink(staging, header=spec.sample_header())
    planned = [Planned(f"{i:032x}", i + 1, ids, [0] * 4 + [1] * (len(ids) - 4)) for i, ids in enumerate(samples)]
    for p in planned:
        n = len(p.input_ids)
        sink.add_chunk(f"eaglebox-{p.id}-0", p.id, p.input_ids, torch.randn(n, k * H, generator=g).bfloat16(),
                       torch.randn(n, H, generator=g).bfloat16())
    sink.flush()
    out.mkdir(parents=True, exist_ok=True)
    entries = [commit_shard(out, i, planned[a : a + shard_size], staging, spec)
               for i, a in enumerate(range(0, len(planned), shard_size))]
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": entries})


def test_training_with_lk_alpha_lowers_the_lk_loss(tiny_target, tmp_path):
    """A real run of the trainer on the tiny target (its embedding, lm_head and shapes; shards in the
    shard format with random features, so what the draft learns is the target's head on them)."""
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.loop import run_train

    cfg = config_for_model(tmp_path, tiny_target, "capture.layer_ids=[0, 1, 2]",
                           f"extract.output_dir={tmp_path / 'shards'}", f"train.output_dir={tmp_path / 'train'}",
                           "train.loss=lk_alpha", "train.draft.draft_vocab_size=64", "train.batch_size=4",
                           "train.max_length=24", "train.ttt_length=2", "train.dtype=float32", "train.lr=3e-3",
                           "train.epochs=100", "train.max_steps=30", "train.log_every=1",
                           "train.checkpoint_every=100")
    spec = capture_spec(cfg)
    g = torch.Generator().manual_seed(0)
    write_shards(tmp_path / "shards", tmp_path / "staging", spec,
                 [torch.randint(3, 2048, (24,), generator=g).tolist() for _ in range(8)], 4)
    run_train(cfg, spec, log=lambda *_: None)
    out = tmp_path / "train"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(math.isfinite(r["loss"]) for r in rows)
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    print(json.dumps({"lk_loss_first3": first, "lk_loss_last3": last}))
    assert last < 0.8 * first, (first, last)
    assert json.loads((out / "report.json").read_text())["loss"] == "lk_alpha"
    assert (out / "draft" / "model.safetensors").exists()
