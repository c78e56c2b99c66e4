"""Trainer throughput and peak memory: eaglebox vs SpecForge, one optimizer step, same draft, same GPU.

Draft shaped like Llama-3.1-8B's EAGLE-3 head (hidden 4096, 32 heads, 8 KV heads, intermediate 14336,
vocab 128256, draft vocab 32000), sequence 2048, TTT 7, synthetic features (bf16). Each trainer runs
in its own process (fresh CUDA context, clean peak-memory counter), alternating over rounds, and
the script prints per trainer the median over rounds of tokens/s, the largest peak GiB, and the ratios
measured in this one run, per round and of the medians. eaglebox runs the training
loop's step: compiled blocks, flex attention, fused loss, replayed as a CUDA graph (``--eager``
adds the same step without graphs). First, in its own process, it checks that path: losses and
gradients against the eager dense reference (fp32, a small draft, padded batch), and graph
replays against eager steps over two batch shapes.

    python benchmarks/train_throughput.py [--seq 2048] [--ttt 7] [--steps 10] [--rounds 3]
        [--backends flex_attention,sdpa] [--profile] [--eager]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = dict(hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, draft_vocab=32000)


def synthetic(seq: int, device):
    import torch

    from eaglebox.train.vocab import build_vocab

    g = torch.Generator(device="cpu").manual_seed(0)
    H, V = SHAPE["hidden"], SHAPE["vocab"]
    batch = {
        "input_ids": torch.randint(0, V, (1, seq), generator=g),
        "loss_mask": torch.ones(1, seq, dtype=torch.bool),
        "valid": torch.ones(1, seq, dtype=torch.bool),
        "aux": torch.randn(1, seq, 3 * H, generator=g).bfloat16(),
        "last": torch.randn(1, seq, H, generator=g).bfloat16(),
    }
    head = (torch.randn(V, H, generator=g) * H**-0.5).bfloat16()
    embed = (torch.randn(V, H, generator=g) * 0.02).bfloat16()
    counts = torch.zeros(V, dtype=torch.int64)
    counts[torch.randperm(V, generator=g)[: SHAPE["draft_vocab"]]] = 1
    d2t, t2d = build_vocab(counts, SHAPE["draft_vocab"])
    return {k: v.to(device) for k, v in batch.items()}, head.to(device), embed.to(device), d2t.to(device), t2d.to(device)


def timed(step, steps: int, tokens: int, warmup: int = 2) -> dict:
    """Median seconds per step over ``steps`` steps timed one by one after ``warmup`` (and the
    ``tokens`` a step trains on per second of it), and peak memory over all of them: a CUDA graph
    allocates only while it is captured (in warm-up), so peaks counted after warm-up would miss it. ``step_s`` keeps every step's time, so a recompile
    or a slow step shows instead of moving the mean. ``peak_gib`` is allocated memory,
    ``reserved_gib`` what the caching allocator holds."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    s_per_step = statistics.median(times)
    return {"s_per_step": s_per_step, "tokens_per_s": tokens / s_per_step, "step_s": [round(t, 4) for t in times],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


def gpu_time_by_kernel(step, steps: int = 2) -> dict:
    """CUDA time per step (ms) by kernel family, from torch.profiler: how much of the wall time
    the GPU is busy, and with what."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    families: dict[str, float] = {}
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0 and not e.key.startswith("cuda")]
    for e in kernels:
        n = e.key.lower()
        fam = ("gemm" if any(x in n for x in ("gemm", "cutlass", "nvjet", "cublas", "xmma")) else
               "flex attention" if "flex" in n else "adam" if "adam" in n else
               "fused (triton)" if n.startswith("triton") else "other")
        families[fam] = families.get(fam, 0.0) + e.device_time_total / steps / 1000
    out = {k: round(v, 2) for k, v in sorted(families.items(), key=lambda kv: -kv[1])}
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:20]
    out["top"] = [(e.key[:90], round(e.device_time_total / steps / 1000, 2), e.count // steps) for e in top]
    return out


def eaglebox_step(spec, embed, d2t, t2d, head, ttt: int, max_length: int, graphs: bool, lr_lambda=None):
    """The training loop's own step on a fresh draft: compiled blocks, fused AdamW, and (``graphs``)
    CUDA graphs. Returns the step function (batch -> grad norm, stats) and the model."""
    import torch

    from eaglebox.train.dist import Dist
    from eaglebox.train.model import Eagle3Draft
    from eaglebox.train.step import make_optimizer, make_step

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Eagle3Draft(spec)
    model.embed_tokens.to(embed.dtype)  # as run_train does
    model.to(dev).compile_steps(max_length)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, lr=1e-4, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda or (lambda s: 1.0))
    weights = torch.tensor([0.8**i for i in range(ttt)], device=dev)
    step = make_step(model, opt, params, head, weights, 0.5, Dist(), bf16=True, graphs=graphs)

    def step_and_schedule(batch):
        out = step(batch)
        sched.step()
        return out

    return step_and_schedule, model


def run_eaglebox(seq: int, ttt: int, steps: int, profile: bool = False, graphs: bool = True) -> dict:
    import torch

    batch, head, embed, d2t, t2d = synthetic(seq, torch.device("cuda"))
    step, _ = eaglebox_step(big_spec(), embed, d2t, t2d, head, ttt, seq, graphs)
    out = {"trainer": "eaglebox" + ("" if graphs else " (eager)"), **timed(lambda: step(batch), steps, seq)}
    if profile:
        out["gpu_ms_per_step"] = gpu_time_by_kernel(lambda: step(batch))
    return out


def big_spec():
    from eaglebox.draft.spec import DraftSpec

    H = SHAPE["hidden"]
    return DraftSpec(hidden_size=H, target_hidden_size=H, num_aux=3, num_attention_heads=SHAPE["heads"],
                     num_key_value_heads=SHAPE["kv_heads"], head_dim=H // SHAPE["heads"],
                     intermediate_size=SHAPE["intermediate"], vocab_size=SHAPE["vocab"],
                     draft_vocab_size=SHAPE["draft_vocab"], rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling=None, max_position_embeddings=8192)


def small_spec():
    from eaglebox.draft.spec import DraftSpec

    return DraftSpec(hidden_size=256, target_hidden_size=256, num_aux=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, intermediate_size=512, vocab_size=1000, draft_vocab_size=300, rms_norm_eps=1e-5,
                     rope_theta=500000.0, rope_scaling=None, max_position_embeddings=8192)


def check_graphs() -> dict:
    """Eager steps and graph replays train the same: five steps over two batch shapes (a second
    capture in the shared pool), with a learning rate that changes every step."""
    import torch

    from eaglebox.train.vocab import build_vocab

    dev = torch.device("cuda")
    spec = small_spec()
    g = torch.Generator().manual_seed(1)
    d2t, t2d = build_vocab(torch.randint(0, 50, (1000,), generator=g), 300)
    embed = torch.randn(1000, 256, generator=g).bfloat16().to(dev)
    head = (torch.randn(1000, 256, generator=g) * 0.1).bfloat16().to(dev)

    def batch(T):
        b = {"input_ids": torch.randint(0, 1000, (2, T), generator=g), "loss_mask": torch.rand(2, T, generator=g) > 0.2,
             "valid": torch.ones(2, T, dtype=torch.bool), "aux": torch.randn(2, T, 768, generator=g).bfloat16(),
             "last": torch.randn(2, T, 256, generator=g).bfloat16()}
        b["valid"][1, T - 50 :] = False
        return {k: v.to(dev) for k, v in b.items()}

    batches = [batch(T) for T in (256, 384, 256, 384, 256)]
    runs = []
    for graphs in (False, True):
        step, model = eaglebox_step(spec, embed, d2t.to(dev), t2d.to(dev), head, 5, 384, graphs, lambda s: (s + 1) / 5)
        stats = torch.stack([step(b)[1] for b in batches])
        runs.append((stats, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}))
    (s0, w0), (s1, w1) = runs
    return {"check": "CUDA graph replays vs eager steps (bf16, 5 steps, 2 shapes)",
            "stats_max_abs_diff": float((s0 - s1).abs().max()),
            "weights_max_abs_diff": max(float((w0[n] - w1[n]).abs().max()) for n in w0)}


def check_fused() -> dict:
    import torch

    from eaglebox.train.model import Eagle3Draft
    from eaglebox.train.ttt import ttt_forward
    from eaglebox.train.vocab import build_vocab

    dev = torch.device("cuda")
    torch.manual_seed(0)
    spec = small_spec()
    ref = Eagle3Draft(spec).to(dev)
    with torch.no_grad():
        d2t, t2d = build_vocab(torch.randint(0, 50, (1000,)), 300)
        ref.d2t.copy_(d2t)
        ref.t2d.copy_(t2d)
    fast = Eagle3Draft(spec).to(dev)
    fast.load_state_dict(ref.state_dict())
    T = 300
    fast.compile_steps(T)
    batch = {"input_ids": torch.randint(0, 1000, (2, T), device=dev), "loss_mask": torch.rand(2, T, device=dev) > 0.2,
             "valid": torch.ones(2, T, dtype=torch.bool, device=dev), "aux": torch.randn(2, T, 768, device=dev),
             "last": torch.randn(2, T, 256, device=dev)}
    batch["valid"][1, 250:] = False
    head = torch.randn(1000, 256, device=dev) * 0.1
    out = []
    for model in (ref, fast):
        losses, correct, _ = ttt_forward(model, batch, head, 5)
        (0.8 ** torch.arange(5, device=dev) * losses).sum().backward()
        out.append((losses, correct,
                    {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (l0, c0, g0), (l1, c1, g1) = out
    return {"check": "fused CUDA path vs eager dense reference (fp32)", "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "loss_max_rel_diff": float(((l0 - l1).abs() / l0.abs()).max()), "correct_equal": bool((c0 == c1).all()),
            "grad_max_rel_diff": max(float((g0[n] - g1[n]).abs().max() / g0[n].abs().max()) for n in g0)}


def step_gemm_flops(seq: int, ttt: int) -> float:
    """The dense matmul FLOPs of one training step (batch 1), counted from the draft's shapes as the
    trainer runs them: per TTT step the hidden half of the q/k/v projection, o, the MLP and the draft
    lm_head, forward and backward (input and weight gradients: 3x forward); the token half of the
    q/k/v projection once over ``seq - 1 + ttt`` rows (``Eagle3Draft.token_proj``; 3x: its input
    gradient feeds input_layernorm's weight); fc once (weight gradient only: 2x); the target's
    full-vocabulary head once, forward only. Attention's score/value products are not counted (they
    are not GEMMs here)."""
    H, h = SHAPE["hidden"], SHAPE["hidden"] // SHAPE["heads"]
    qkv = H * (SHAPE["heads"] + 2 * SHAPE["kv_heads"]) * h
    per_step = 2 * seq * (qkv + SHAPE["heads"] * h * H + 3 * H * SHAPE["intermediate"] + H * SHAPE["draft_vocab"])
    tokens = 3 * 2 * (seq - 1 + ttt) * qkv
    return 3 * ttt * per_step + tokens + 2 * (2 * seq * 3 * H * H) + 2 * seq * H * SHAPE["vocab"]


def dense_bf16_rate(n: int = 8192, reps: int = 20) -> float:
    """FLOP/s of a large square bf16 matmul on this GPU (median of ``reps``): the rate the floor uses."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * n**3 / statistics.median(times)


def run_specforge(seq: int, ttt: int, steps: int, backend: str) -> dict:
    import torch
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    dev = torch.device("cuda")
    batch, head, embed, d2t, t2d = synthetic(seq, dev)
    H = SHAPE["hidden"]
    cfg = LlamaConfig(hidden_size=H, num_attention_heads=SHAPE["heads"], num_key_value_heads=SHAPE["kv_heads"],
                      intermediate_size=SHAPE["intermediate"], vocab_size=SHAPE["vocab"], num_hidden_layers=1,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, hidden_act="silu",
                      tie_word_embeddings=False)
    cfg.draft_vocab_size = SHAPE["draft_vocab"]
    cfg.target_hidden_size = H
    draft = LlamaForCausalLMEagle3(cfg, attention_backend=backend).to(dev)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed.float())
        draft.embed_tokens.weight.requires_grad_(False)
        draft.t2d.copy_(t2d)
        draft.d2t.copy_(d2t)
    model = OnlineEagle3Model(draft, length=ttt, attention_backend=backend)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), fused=True)
    weights = [0.8**i for i in range(ttt)]
    ids, mask = batch["input_ids"], batch["loss_mask"].long()[..., None]  # SpecForge takes [B, T, 1]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), target=None, loss_mask=mask,
                        hidden_states=batch["aux"], target_hidden_for_compact=batch["last"],
                        target_head_weight=head)
        loss = sum(w * lo for w, lo in zip(weights, out[0]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()

    return {"trainer": f"specforge ({backend})", **timed(step, steps, seq)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="flex_attention,sdpa", help="SpecForge attention backends to run")
    p.add_argument("--profile", action="store_true", help="also report eaglebox's GPU time by kernel family")
    p.add_argument("--eager", action="store_true", help="also run eaglebox's step without CUDA graphs")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        kind, _, backend = a.one.partition(":")
        try:
            r = ({**check_fused(), **check_graphs(), "dense_bf16_flops": dense_bf16_rate()} if kind == "check" else
                 run_eaglebox(a.seq, a.ttt, a.steps, a.profile, graphs=backend != "eager") if kind == "eaglebox"
                 else run_specforge(a.seq, a.ttt, a.steps, backend))
        except Exception as err:  # reported in the table, not hidden
            r = {"trainer": a.one, "error": f"{type(err).__name__}: {err}"[:600]}
        print("RESULT " + json.dumps(r), flush=True)
        return
    results = []
    ours = ["eaglebox"] + (["eaglebox:eager"] if a.eager else [])
    for kind in ["check"] + (ours + [f"specforge:{b}" for b in a.backends.split(",")]) * a.rounds:
        out = subprocess.run([sys.executable, __file__, "--one", kind, "--seq", str(a.seq), "--ttt", str(a.ttt),
                              "--steps", str(a.steps), *(["--profile"] if a.profile else [])], capture_output=True, text=True, env=os.environ)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        results.append(json.loads(line[-1][7:]) if line else {"trainer": kind, "error": out.stderr[-600:]})
        print(json.dumps(results[-1]), flush=True)
    summarize(results[1:], a, results[0].get("dense_bf16_flops"))


def summarize(results: list[dict], a, dense_rate: float | None) -> None:
    """Per trainer: the median over rounds of each process's median step, and the spread across
    rounds. Ratios: of those medians, and per round (each round runs the trainers back to back,
    so a round's ratio is measured under the same GPU conditions)."""
    runs: dict[str, list[dict]] = {}
    for r in results:
        if "error" not in r:
            runs.setdefault(r["trainer"], []).append(r)
    med = {name: statistics.median(r["s_per_step"] for r in rs) for name, rs in runs.items()}
    print(f"\nseq {a.seq}, TTT {a.ttt}, draft {SHAPE}, {a.steps} timed steps per process")
    print(f"{'trainer':28s} {'rounds':>6s} {'tokens/s':>9s} {'s/step':>7s} {'min-max s/step':>15s} "
          f"{'peak GiB':>9s} {'reserved':>9s}")
    for name, rs in runs.items():
        s = [r["s_per_step"] for r in rs]
        print(f"{name:28s} {len(rs):6d} {a.seq / med[name]:9.0f} {med[name]:7.4f} {min(s):7.4f}-{max(s):.4f} "
              f"{max(r['peak_gib'] for r in rs):9.2f} {max(r['reserved_gib'] for r in rs):9.2f}")
    ours = runs.get("eaglebox")
    for name, rs in runs.items():
        if ours and name != "eaglebox":
            rounds = [o["tokens_per_s"] / r["tokens_per_s"] for o, r in zip(ours, rs)]
            peak = max(o["peak_gib"] for o in ours) / max(r["peak_gib"] for r in rs)
            print(f"eaglebox / {name}: {med[name] / med['eaglebox']:.2f}x tokens/s (median of rounds; per round "
                  f"{', '.join(f'{x:.2f}' for x in rounds)}; worst {min(rounds):.2f}), {peak:.2f}x peak memory")
    if ours and dense_rate:
        flops = step_gemm_flops(a.seq, a.ttt)
        floor = flops / dense_rate
        print(f"GEMM floor: {flops / 1e12:.2f} TFLOP a step at {dense_rate / 1e12:.0f} TFLOP/s (8192^3 bf16 matmul, "
              f"measured) = {floor * 1e3:.1f} ms; eaglebox's median step {med['eaglebox'] * 1e3:.1f} ms = "
              f"{med['eaglebox'] / floor:.2f}x the floor")


if __name__ == "__main__":
    main()
