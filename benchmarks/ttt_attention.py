"""TTT attention kernels on one GPU: flex attention with the block-sparse TTT mask against FlashAttention
for the causal keys merged with the diagonal ones (``eaglebox.train.ttt.flash_ttt_attention``).

For each shape (Llama-3.1-8B's draft: 32 query heads, 8 KV heads, head 128; Kimi-K2.5's MLA draft
expanded: 64 heads, keys 192, values 128), sequence 2048, TTT 7: the whole unroll's attention,
forward and backward, timed side by side in one process over ``--rounds`` rounds (median of
``--reps`` each), and each kernel's bf16 output and gradients against the fp32 dense reference
(``ttt_attention``), next to the dense reference's own bf16 error.

    python benchmarks/ttt_attention.py [--seq 2048] [--ttt 7] [--rounds 3] [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from eaglebox.train.ttt import flash_ttt_attention, flex_ttt_attention, ttt_attention

SHAPES = {"llama-8b": dict(heads=32, kv_heads=8, dk=128, dv=128), "kimi-mla": dict(heads=64, kv_heads=64, dk=192, dv=128)}


def inputs(shape: dict, T: int, ttt: int, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.device("cuda")
    q = [torch.randn(1, shape["heads"], T, shape["dk"], generator=g, device=dev, dtype=dtype) for _ in range(ttt)]
    k = [torch.randn(1, shape["kv_heads"], T, shape["dk"], generator=g, device=dev, dtype=dtype) for _ in range(ttt)]
    v = [torch.randn(1, shape["kv_heads"], T, shape["dv"], generator=g, device=dev, dtype=dtype) for _ in range(ttt)]
    return q, k, v


def unroll(fn, q, k, v, grads):
    """Every TTT step's attention and its backward, as the trainer runs them (step i sees keys 0..i)."""
    valid = torch.ones(1, q[0].shape[2], dtype=torch.bool, device=q[0].device)
    leaves = [x.detach().requires_grad_() for x in q + k + v]
    n = len(q)
    qs, ks, vs = leaves[:n], leaves[n : 2 * n], leaves[2 * n :]
    outs = [fn(qs[i], ks[: i + 1], vs[: i + 1], valid, n) for i in range(n)]
    torch.autograd.backward(outs, grads)
    return outs, [x.grad for x in leaves]


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    kernels = {"flex": flex_ttt_attention, "flash": flash_ttt_attention}
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, seq {a.seq}, TTT {a.ttt}")
    for name, shape in SHAPES.items():
        q, k, v = inputs(shape, a.seq, a.ttt, torch.float32)
        grads = [torch.randn_like(x) for x in q]
        ref_out, ref_grad = unroll(ttt_attention, q, k, v, grads)
        bf = [[x.bfloat16() for x in xs] for xs in (q, k, v)]
        bf_grads = [g.bfloat16() for g in grads]
        errors = {}
        for kname, fn in {"dense (bf16)": ttt_attention, **kernels}.items():
            out, grad = unroll(fn, *bf, bf_grads)
            errors[kname] = {"out": max(rel_err(o, r) for o, r in zip(out, ref_out)),
                             "grad": max(rel_err(g, r) for g, r in zip(grad, ref_grad))}
        del ref_out, ref_grad
        times: dict[str, list[float]] = {k: [] for k in kernels}
        for _ in range(a.rounds):
            for kname, fn in kernels.items():
                for _ in range(2):
                    unroll(fn, *bf, bf_grads)
                ts = []
                for _ in range(a.reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    unroll(fn, *bf, bf_grads)
                    end.record()
                    end.synchronize()
                    ts.append(start.elapsed_time(end))
                times[kname].append(statistics.median(ts))
        ratios = [f / g for f, g in zip(times["flex"], times["flash"])]
        print(json.dumps({"shape": name, **shape, "ms_per_unroll": {k: [round(x, 2) for x in v] for k, v in times.items()},
                          "flex_over_flash_per_round": [round(r, 2) for r in ratios],
                          "max_rel_err_vs_fp32": errors}), flush=True)


if __name__ == "__main__":
    main()
