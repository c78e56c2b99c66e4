"""Training on several GPUs of one host: tokens/s, scaling efficiency, step time split and peak memory per
rank, DDP vs FSDP2, at the Llama-3.1-8B and Kimi-K2.5 draft widths.

For each width, each of ``--parallel`` and each rank count (default 1, 2, 4, 8, capped at the GPUs
present) this launches ``torchrun --standalone --nproc-per-node N`` on this file; every rank builds the
draft as ``eaglebox train`` does (``train/loop.py``: ``Eagle3Draft`` from the recipe's ``DraftSpec``,
frozen bf16 target embedding, ``compile_steps`` on CUDA, ``parallelize`` (DDP or FSDP2),
``make_optimizer``, ``make_step``: CUDA graphs only at one rank, as the loop) and runs that step as the
loop does (no host sync between steps), on the same per-rank batch at every rank count (the recipe's
``batch_size`` x ``max_length`` unless ``--batch``/``--seq`` say otherwise): synthetic features in
memory, or with ``--shards DIR`` each rank's slices of the global batches read from captured shards
by the loop's own ``batch_indices`` and ``collate``, after ``ShardReader`` and the vocabulary pass
(timed per rank). The draft's shape comes from the recipe config (``configs/llama-3.1-8b-1gpu.yaml``,
``configs/kimi-k2.5-8x-rtxpro6000.yaml``: its ``deepseek_mla`` draft) through ``draft_spec`` on the
target's ``config.json`` shape. One rank runs once a width (``parallelize`` leaves one process
unwrapped) and is the baseline of both.

Per run, one JSON line: tokens/s over all ranks (every rank's valid tokens / the slowest rank's time
for ``--steps`` steps), efficiency = tokens/s / (N x the 1-rank tokens/s), the step split from
``torch.profiler`` over ``--profile-steps`` more steps (GPU: kernel time of NCCL collectives vs all
other kernels, per step; they overlap under DDP, so the two can add up to more than the step; CPU:
gloo ops' time vs the rest of the step), peak memory per rank (GPU: ``torch.cuda.max_memory_allocated``;
CPU: peak RSS, the allocator has no counter). Then a table. ``--cpu`` runs gloo on the CPU at tiny
widths (one thread a rank): a check that the harness and the distributed step work, not a
measurement of NCCL scaling.

    python benchmarks/train_scaling.py [--ranks 1,2,4,8] [--parallel ddp fsdp]
        [--widths llama-3.1-8b kimi-k2.5] [--seq N] [--batch N] [--ttt N] [--steps 10] [--warmup 3]
        [--shards DIR (one width: the shards' hidden size)]
    python benchmarks/train_scaling.py --cpu --ranks 1,2 --seq 128 --batch 2 --steps 5 --warmup 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The targets' config.json shapes (what draft_spec reads) and the recipe whose train.draft shapes the draft.
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
            "vocab_size": 128256, "num_hidden_layers": 32, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192},
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
KIMI_K25 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
            "num_attention_heads": 64, "num_key_value_heads": 64, "intermediate_size": 18432, "vocab_size": 163840,
            "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 4096},
            "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
ASSETS = ROOT / "src" / "eaglebox_dev" / "assets"
WIDTHS = {  # name: (target config.json, recipe, overrides)
    "llama-3.1-8b": (LLAMA_8B, "configs/llama-3.1-8b-1gpu.yaml", []),
    "kimi-k2.5": (KIMI_K25, "configs/kimi-k2.5-8x-rtxpro6000.yaml", []),
    # CPU: the shipped tiny targets; tiny-kimi is the Kimi recipe's MLA draft on the tiny DeepSeek-V3 target
    "tiny": (ASSETS / "tiny-target" / "config.json", "configs/tiny-cpu.yaml", []),
    "tiny-kimi": (ASSETS / "tiny-mla-target" / "config.json", "configs/kimi-k2.5-8x-rtxpro6000.yaml",
                  ["train.draft.draft_vocab_size=1024"]),
}


def width_spec(name: str):
    """The recipe's DraftSpec on the target's config shape, as ``eaglebox train`` computes it, and the
    recipe's ``train`` block."""
    from eaglebox.config import load_config
    from eaglebox.draft.spec import draft_spec

    target, recipe, overrides = WIDTHS[name]
    with tempfile.TemporaryDirectory() as tmp:
        hf = json.loads(target.read_text()) if isinstance(target, Path) else target
        (Path(tmp) / "config.json").write_text(json.dumps(hf))
        cfg = load_config(ROOT / recipe, [f"model.path={tmp}", *overrides])
        return draft_spec(Path(tmp), cfg.train.draft, num_aux=3), cfg.train


def synthetic_weights(spec, device):
    """Random bf16 target embedding and lm_head, made on ``device`` (at Kimi width 1.2G values each), and
    vocabulary counts: the same on every rank."""
    import torch

    gd = torch.Generator(device=device).manual_seed(0)
    V, H = spec.vocab_size, spec.hidden_size
    head = torch.randn(V, H, generator=gd, device=device, dtype=torch.bfloat16) * H**-0.5
    embed = torch.randn(V, H, generator=gd, device=device, dtype=torch.bfloat16) * 0.02
    return head, embed, torch.randint(0, 1000, (V,), generator=torch.Generator().manual_seed(0))


def synthetic_batch(spec, batch: int, seq: int, seed: int, device) -> dict:
    """One rank's batch of random features on ``device`` in the target's dtype (bf16): every token
    valid and loss-masked (scored where its target is in the draft vocabulary)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    H, V = spec.target_hidden_size, spec.vocab_size
    b = {"input_ids": torch.randint(0, V, (batch, seq), generator=g),
         "loss_mask": torch.ones(batch, seq, dtype=torch.bool), "valid": torch.ones(batch, seq, dtype=torch.bool),
         "aux": torch.randn(batch, seq, spec.num_aux * H, generator=g).bfloat16(),
         "last": torch.randn(batch, seq, H, generator=g).bfloat16()}
    return {k: v.to(device) for k, v in b.items()}


def step_split(one_step, steps: int, cuda: bool) -> dict:
    """Per step, from torch.profiler: ms of collective communication and of everything else. GPU:
    device time of NCCL kernels vs all other kernels. CPU: the time of the ``gloo:`` ops (the
    collectives' work, waits for the slower rank included) vs the rest of the profiled wall step."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            one_step()
        sync()
    wall_ms = (time.perf_counter() - t0) * 1000 / steps
    comm: dict[str, float] = {}
    compute = 0.0
    for e in prof.key_averages():
        if cuda:
            if e.device_type != DeviceType.CUDA:  # kernels only: a CPU op's device time is its kernels' again
                continue
            ms = e.self_device_time_total / 1000 / steps
            if "nccl" in e.key.lower():
                comm[e.key[:60]] = comm.get(e.key[:60], 0.0) + ms
            else:
                compute += ms
        elif e.key.startswith("gloo:"):  # the collective's work (c10d:: ops only enqueue it)
            comm[e.key[:60]] = comm.get(e.key[:60], 0.0) + e.cpu_time_total / 1000 / steps
    comm_ms = sum(comm.values())
    return {"profiled_step_ms": round(wall_ms, 2), "comm_ms": round(comm_ms, 2),
            "compute_ms": round(compute if cuda else wall_ms - comm_ms, 2),
            "comm_ops_ms": {k: round(v, 2) for k, v in sorted(comm.items(), key=lambda kv: -kv[1])}}


def batches(a, spec, d, seq: int, pad: int):
    """The batches a rank trains on, and what it cost to get them ready. Without ``--shards``: one
    synthetic batch, every step. With it: the loop's data path, timed: ``ShardReader`` and the
    vocabulary pass (``draft_vocab``: each rank its share) once, then per step this rank's slice of
    the global batch (``batch_indices``) read from its sample files (``collate``)."""
    from eaglebox.train.vocab import build_vocab

    head, embed, counts = synthetic_weights(spec, d.device)
    if not a.shards:
        batch = synthetic_batch(spec, a.batch, seq, 1000 + d.rank, d.device)
        return (lambda k: batch), head, embed, build_vocab(counts, spec.draft_vocab_size), {}
    from eaglebox.shards.format import ShardReader
    from eaglebox.train.data import batch_indices, collate, steps_per_epoch
    from eaglebox.train.vocab import draft_vocab

    t0 = time.perf_counter()
    reader = ShardReader(a.shards)
    t1 = time.perf_counter()
    vocab = draft_vocab(reader, spec.vocab_size, spec.draft_vocab_size, d)
    t2 = time.perf_counter()
    if reader.header.get("hidden_size") != spec.target_hidden_size:
        sys.exit(f"{a.shards}: features {reader.header.get('hidden_size')} wide, the {a.width} draft reads "
                 f"{spec.target_hidden_size}")
    per_epoch = steps_per_epoch(len(reader), d.world, a.batch)
    if per_epoch == 0:
        sys.exit(f"{a.shards}: {len(reader)} samples are fewer than one step ({d.world} ranks x {a.batch})")
    read = {"reader_s": t1 - t0, "vocab_pass_s": t2 - t1, "collate_s": 0.0, "samples": len(reader)}

    def batch(k: int):
        t = time.perf_counter()
        ids = batch_indices(len(reader), 0, k // per_epoch, k % per_epoch, d.world, d.rank, a.batch)
        b = {k: v.to(d.device, non_blocking=True) for k, v in collate(reader, ids, seq, pad).items()}
        read["collate_s"] += time.perf_counter() - t
        return b

    return batch, head, embed, vocab, read


def worker(a) -> None:
    """One rank: the trainer's model, wrapper, optimizer and step (``train/loop.py``), timed as the loop
    runs them: no host sync between steps (so a step's read overlaps the one before it on a GPU)."""
    import torch
    import torch.distributed as dist

    from eaglebox.train.dist import Dist
    from eaglebox.train.loop import parallelize
    from eaglebox.train.model import PAD_MULTIPLE, Eagle3Draft
    from eaglebox.train.step import make_optimizer, make_step

    d = Dist()
    cuda = d.device.type == "cuda"
    spec, _ = width_spec(a.width)
    pad = PAD_MULTIPLE if cuda else 1  # as the loop pads on CUDA
    seq = -(-a.seq // pad) * pad
    next_batch, head, embed, (d2t, t2d), read = batches(a, spec, d, seq, pad)
    torch.manual_seed(0)
    model = Eagle3Draft(spec)
    model.embed_tokens.to(embed.dtype)  # as run_train: frozen, in the target's dtype
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    model.to(d.device)
    if cuda:
        model.compile_steps(seq)
    wrapped = parallelize(model, a.how, d.world)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, 1e-4, 0.0)
    weights = torch.tensor([0.8**i for i in range(a.ttt)], device=d.device)
    graphs = cuda and d.world == 1 and not a.no_graphs  # the loop's rule (train.cuda_graphs on)
    step = make_step(wrapped, optimizer, params, head, weights, 0.5, d, bf16=cuda, graphs=graphs)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # before warm-up: graph capture and compile allocate there
    t0 = time.perf_counter()
    for k in range(a.warmup):
        step(next_batch(k))
    sync()
    d.barrier()
    warmup_s = time.perf_counter() - t0
    if read:
        read["collate_s"] = 0.0  # the timed steps' reads only
    tokens = scored = torch.zeros((), dtype=torch.int64, device=d.device)
    t0 = time.perf_counter()
    for k in range(a.warmup, a.warmup + a.steps):
        b = next_batch(k)
        _, stats = step(b)
        tokens, scored = tokens + b["valid"].sum(), scored + stats[2][0].long()
    sync()
    total = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    split = step_split(lambda: step(next_batch(0)), a.profile_steps, cuda) if a.profile_steps else {}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
    mine = {"rank": d.rank, "total_s": total, "tokens": int(tokens), "scored": int(scored), "peak_gib": peak,
            "peak_rss_gib": rss, "params_local": local, "warmup_s": warmup_s, **split,
            **({"read": {k: round(v, 3) if isinstance(v, float) else v for k, v in read.items()}} if read else {})}
    ranks = [None] * d.world
    if d.world > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if d.rank == 0:
        total = max(r["total_s"] for r in ranks)  # the collectives make every rank wait for the slowest
        tokens = sum(r["tokens"] for r in ranks)
        r0 = ranks[0]
        print("RESULT " + json.dumps({
            "width": a.width, "parallel": a.how if d.world > 1 else "none", "ranks": d.world,
            "backend": dist.get_backend() if d.world > 1 else "-", "device": torch.cuda.get_device_name() if cuda
            else "cpu", "torch": torch.__version__, "data": a.shards or "synthetic, in memory", "seq": seq,
            "batch_per_rank": a.batch, "ttt": a.ttt, "steps": a.steps, "cuda_graphs": graphs, "compiled": cuda,
            "params": sum(p.numel() for p in params), "params_per_rank": [r["params_local"] for r in ranks],
            "tokens_per_step": tokens / a.steps, "scored_per_step": sum(r["scored"] for r in ranks) / a.steps,
            "step_s": round(total / a.steps, 4), "step_s_per_rank": [round(r["total_s"] / a.steps, 4) for r in ranks],
            "tokens_per_s": round(tokens / total, 1),
            "comm_ms": r0.get("comm_ms"), "compute_ms": r0.get("compute_ms"),
            "profiled_step_ms": r0.get("profiled_step_ms"), "comm_ops_ms": r0.get("comm_ops_ms"),
            "peak_gib_per_rank": [None if r["peak_gib"] is None else round(r["peak_gib"], 2) for r in ranks],
            "peak_rss_gib_per_rank": [round(r["peak_rss_gib"], 2) for r in ranks],
            **({"read_per_rank": [r["read"] for r in ranks]} if "read" in r0 else {}),
            "warmup_s": round(max(r["warmup_s"] for r in ranks), 1)}), flush=True)
    d.barrier()
    if d.world > 1:
        dist.destroy_process_group()


def launch(a, width: str, parallel: str, n: int) -> dict:
    """One ``torchrun`` run; its rank 0's RESULT, or the error. Sequence length, per-rank batch and
    TTT length: the options', else the recipe's (``train.max_length``, ``batch_size``, ``ttt_length``)."""
    t = width_spec(width)[1]
    seq, batch, ttt = a.seq or t.max_length, a.batch or t.batch_size, a.ttt or t.ttt_length
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), __file__,
           "--worker", "--width", width, "--how", parallel, "--seq", str(seq), "--batch", str(batch),
           "--ttt", str(ttt), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--profile-steps", str(a.profile_steps), *(["--no-graphs"] if a.no_graphs else []),
           *(["--shards", str(Path(a.shards).resolve())] if a.shards else [])]
    env = dict(os.environ)
    if a.cpu:
        env |= {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # one thread a rank: N ranks use N cores
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"width": width, "parallel": parallel, "ranks": n, "error": f"timed out after {a.timeout} s"}
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not lines:
        return {"width": width, "parallel": parallel, "ranks": n, "error": f"rc {out.returncode}: "
                + (out.stderr or out.stdout)[-1500:]}
    return {**json.loads(lines[-1][7:]), "wall_s": round(time.monotonic() - t0, 1)}


def table(results: list[dict]) -> None:
    print(f"\n{'width':13s} {'parallel':8s} {'ranks':>5s} {'tokens/s':>10s} {'eff':>5s} {'step ms':>8s} "
          f"{'comm ms':>8s} {'compute ms':>10s} {'peak GiB/rank (GPU alloc | CPU RSS)':>36s}")
    for r in results:
        if "error" in r:
            print(f"{r['width']:13s} {r['parallel']:8s} {r['ranks']:5d}  error: {r['error'].splitlines()[-1][:80]}")
            continue
        peaks = r["peak_gib_per_rank"] if r["peak_gib_per_rank"][0] is not None else r["peak_rss_gib_per_rank"]
        kind = "alloc" if r["peak_gib_per_rank"][0] is not None else "RSS"
        eff = f"{r['efficiency']:.2f}" if r.get("efficiency") is not None else "-"
        print(f"{r['width']:13s} {r['parallel']:8s} {r['ranks']:5d} {r['tokens_per_s']:10.1f} {eff:>5s} "
              f"{r['step_s'] * 1000:8.1f} {r['comm_ms'] if r['comm_ms'] is not None else '-':>8} "
              f"{r['compute_ms'] if r['compute_ms'] is not None else '-':>10} "
              f"{kind} max {max(peaks):.2f} (min {min(peaks):.2f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4,8", help="rank counts (capped at the GPUs present)")
    p.add_argument("--parallel", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--widths", nargs="+", choices=sorted(WIDTHS), help="default: llama-3.1-8b kimi-k2.5 "
                   "(--cpu: tiny tiny-kimi)")
    p.add_argument("--seq", type=int, help="tokens a sample (default: the recipe's train.max_length: Llama "
                   "2048, Kimi 4096)")
    p.add_argument("--batch", type=int, help="samples a rank a step (default: the recipe's train.batch_size, 1)")
    p.add_argument("--ttt", type=int, help="TTT length (default: the recipe's, 7)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=2, help="profiled steps after the timed ones (0: none)")
    p.add_argument("--no-graphs", action="store_true", help="no CUDA graphs at 1 rank either")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU, tiny widths")
    p.add_argument("--shards", help="read each rank's batches from these shards (eaglebox extract's output_dir, "
                   "captured at the width's hidden size) as the loop does, and time the vocabulary pass")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--width", help=argparse.SUPPRESS)
    p.add_argument("--how", choices=["ddp", "fsdp"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import torch

    gpus = 0 if a.cpu else torch.cuda.device_count()
    if not a.cpu and not gpus:
        sys.exit("no GPU here: use --cpu for the gloo check")
    wanted = [int(x) for x in a.ranks.split(",")]
    ranks = [n for n in wanted if a.cpu or n <= gpus]
    widths = a.widths or (["tiny", "tiny-kimi"] if a.cpu else ["llama-3.1-8b", "kimi-k2.5"])
    print(f"# {shlex.join([Path(sys.executable).name, *sys.argv])}")
    where = (f"CPU, gloo, 1 thread a rank, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"
             if a.cpu else f"{gpus} x {torch.cuda.get_device_name()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {where}, torch {torch.__version__}; ranks {ranks}"
          + (f" (asked {wanted})" if ranks != wanted else ""), flush=True)
    if a.cpu:
        print("# CPU/gloo at tiny widths: checks the harness and the distributed step; its tokens/s, efficiency and "
              "split say nothing about NCCL scaling on GPUs", flush=True)
    results = []
    for width in widths:
        base = None
        for parallel in a.parallel:
            for n in ranks:
                if n == 1 and base is not None:
                    continue  # one rank is not wrapped: the same run for DDP and FSDP2
                r = launch(a, width, parallel, n)
                if n == 1 and "error" not in r:
                    base = r
                if "error" not in r:  # None without a 1-rank run to compare with
                    r["efficiency"] = base and round(r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"]), 3)
                results.append(r)
                print(json.dumps(r), flush=True)
    table(results)


if __name__ == "__main__":
    main()
