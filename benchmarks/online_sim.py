"""Scale plan for Kimi-K2.5 at 600k samples: offline / online / hybrid capture -> training (issue 31, item 5).

A small, stdlib-only fluid simulation in discrete time. Per scenario:

- ``servers`` capture servers (one 8-GPU Kimi-K2.5 engine each) prefill at ``prefill_tok_s`` and keep
  ``capture_eff`` of min(prefill, their sink's target): the disk in offline mode, the NIC otherwise
  (issue 29 measured 0.26-0.37 on the H200 with the GIL-bound sink; its goal is >= 0.9);
- a network of ``link_gbit`` per host (non-blocking switch: the aggregate is the smaller side's NICs);
- a bounded prefetch queue of ``prefetch_batches`` batches of ``BATCH_TOKENS`` per trainer GPU;
- ``trainers`` GPUs consuming at ``TRAINER_TOK_S`` each (measured, Kimi width, one H200).

Modes:
- offline: capture everything to the capture hosts' disks, then train ``epochs`` passes reading them over
  the network (capture GPUs are released before training starts);
- online: capture and train at once, every epoch recaptures every sample, nothing on disk but the queue;
- hybrid: as online, but features captured in epoch 1 are also written to the trainer hosts' disks (at most
  their write rate, up to ``budget_tb``); later epochs read that share from disk and recapture only the rest
  (speculators' --on-generate cache).

Each step moves min(source rates * dt, free queue + what the trainer eats in dt) into the queue, then the trainer
eats min(its rate * dt, queue). With steady rates the pipeline runs at its slowest stage; the simulation adds the
start-up fill, the hybrid epoch split and the budgets, and reports which stage bound it.

Every input is named below with its source: [measured] = a committed result file of this repo,
[public] = a published figure, [assumed] = no figure exists; change it on the command line.

Run: .venv/bin/python benchmarks/online_sim.py > benchmarks/results/online-sim.txt
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

HIDDEN = 7168  # Kimi-K2.5 hidden size (its config.json)
BYTES_PER_TOKEN = HIDDEN * (3 + 1) * 2  # 3 aux layers + last hidden state, bf16 = 57,344 B
SAMPLES = 600_000  # [public] TorchSpec blog: 600k samples / 6B tokens, ~1,500 H200 GPU-hours
TOKENS_PER_SAMPLE = 10_000  # [public] 6B / 600k; issue 31's "830 GB per 10k samples" implies ~1,447
TRAINER_TOK_S = 13_156  # [measured] train_scaling-h200-1rank.txt: Kimi width, seq 4096, TTT 7, one H200
BATCH_TOKENS = 4096  # [measured] the same run's tokens per step
GPUS_PER_SERVER = 8  # Kimi-K2.5 is served on 8 GPUs (kimi-path-facts.md; TorchSpec: TP=8 per node)
GPUS_PER_TRAINER_HOST = 8
DISK_GB_S = 1.4  # [measured] capture-gpu-h200.txt: raw fsync'd write 1.31-1.53 GB/s, one H200 host's disk
PREFILL_TOK_S = 50_000  # [assumed] per 8-GPU server; [public] anchor: SGLang DeepSeek-V3 52.3k input tok/s/node (8xH100, PD+EP)
LINK_GBIT = 100.0  # [assumed] per host NIC
DECODE_TOK_S = 22_300  # [public] SGLang DeepSeek-V3 output tok/s per 8xH100 node (LMSYS, PD + EP, 96 GPUs)
VERIFY_GB_S = (0.2e9, 0.4e9)  # [measured] verified-reads-cpu.txt: read + verify on 2 shared CPU cores
GPU_HOUR_USD = 3.0  # [assumed] one price for every GPU-hour; cost scales linearly


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str  # offline | online | hybrid
    servers: int = 4
    trainers: int = 16
    prefill_tok_s: float = PREFILL_TOK_S
    capture_eff: float = 0.9
    link_gbit: float = LINK_GBIT
    disk_gb_s: float = DISK_GB_S
    epochs: int = 1
    tokens_per_sample: float = TOKENS_PER_SAMPLE
    budget_tb: float = 0.0
    prefetch_batches: int = 4


@dataclass
class Result:
    wall_h: float
    capture_h: float  # wall hours the capture servers are held
    util: float  # trained tokens / (trainer GPUs * TRAINER_TOK_S * hours trainers are held)
    net_gb_s: float  # mean bytes/s over the network while training (offline: capture phase shown apart)
    host_gbit: float  # the same per receiving trainer host, Gbit/s
    disk_tb: float  # disk high-water mark, all hosts
    queue_gb: float  # prefetch queue high-water mark, all trainer GPUs
    gpu_h: float
    bound: str


def tb(x: float) -> float:
    return x / 1e12


def simulate(s: Scenario) -> Result:
    b = BYTES_PER_TOKEN
    total = SAMPLES * s.tokens_per_sample  # tokens per epoch
    link = s.link_gbit * 1e9 / 8  # B/s per host
    disk = s.disk_gb_s * 1e9
    hosts = math.ceil(s.trainers / GPUS_PER_TRAINER_HOST)
    train_rate = s.trainers * TRAINER_TOK_S
    net_tok = min(s.servers, hosts) * link / b  # aggregate network, tokens/s
    qcap = s.trainers * s.prefetch_batches * BATCH_TOKENS  # tokens

    capture_h = 0.0
    disk_hw = 0.0
    if s.mode == "offline":  # phase 1: capture to the capture hosts' own disks, a constant-rate fill
        cap = s.servers * s.capture_eff * min(s.prefill_tok_s, disk / b)
        capture_h = total / cap / 3600
        disk_hw = total * b
    cached = 0.0  # hybrid: tokens of features kept on the trainer hosts' disks
    budget_tok = s.budget_tb * 1e12 / b

    t = 0.0
    queue = q_hw = 0.0
    net_bytes = 0.0
    limits: dict[str, float] = {}
    for epoch in range(s.epochs):
        # sources of this epoch: share f from disk, 1 - f captured live
        if s.mode == "offline":
            f = 1.0
            disk_rate = min(s.servers * disk, s.servers * link, hosts * link) / b  # read over the network
        elif s.mode == "hybrid" and epoch > 0:
            f = cached / total
            disk_rate = hosts * disk / b  # local disks of the trainer hosts
        else:
            f, disk_rate = 0.0, math.inf
        live_rate = min(s.servers * s.capture_eff * min(s.prefill_tok_s, link / b), net_tok)
        live_key = "capture" if live_rate < net_tok else "network"
        rates = {"trainer": train_rate}  # tokens/s the trainer could take if only this stage limited it
        if f < 1:
            rates[live_key] = live_rate / (1 - f)
        if f > 0:
            rates["disk"] = disk_rate / f
        for k, v in rates.items():
            limits[k] = min(limits.get(k, math.inf), v)
        dt = max(0.5, total / min(rates.values()) / 4000)  # ~4,000 steps an epoch
        supplied = eaten = 0.0
        while eaten < total - 1e-6:
            src = min(rates.get(live_key, math.inf), rates.get("disk", math.inf)) * dt
            step = min(src, qcap - queue + train_rate * dt, total - supplied)
            supplied += step
            queue += step
            live = step * (1 - f)
            if s.mode == "offline":
                net_bytes += step * b
            else:
                net_bytes += live * b
            if (
                s.mode == "hybrid" and epoch == 0 and cached < budget_tok
            ):  # kept as far as the disks absorb it
                cached = min(budget_tok, cached + min(live, hosts * disk / b * dt))
            eat = min(train_rate * dt, queue)
            queue -= eat
            eaten += eat
            q_hw = max(q_hw, queue)  # what waits for the trainer after its step: <= qcap
            t += dt
        if s.mode == "hybrid":
            disk_hw = max(disk_hw, cached * b)
    train_h = t / 3600
    if s.mode != "offline":
        capture_h = train_h
    bound = min(limits, key=limits.get)
    gpu_h = capture_h * s.servers * GPUS_PER_SERVER + train_h * s.trainers
    return Result(
        wall_h=train_h + (capture_h if s.mode == "offline" else 0.0),
        capture_h=capture_h,
        util=s.epochs * total / (train_rate * t),
        net_gb_s=net_bytes / t / 1e9,
        host_gbit=net_bytes / t * 8 / hosts / 1e9,
        disk_tb=tb(disk_hw),
        queue_gb=q_hw * b / 1e9,
        gpu_h=gpu_h,
        bound=bound,
    )


def scenarios() -> list[Scenario]:
    base = Scenario("online, 4 servers : 16 trainers", "online")
    return [
        Scenario("offline, sink as measured (eff 0.3)", "offline", servers=4, capture_eff=0.3),
        Scenario("offline, sink at goal (eff 0.9)", "offline", servers=4),
        Scenario("offline, eff 0.9, disks 6 GB/s", "offline", servers=4, disk_gb_s=6.0),
        Scenario("online, TorchSpec shape 2:16", "online", servers=2),
        Scenario(
            "online, 2:16, prefill 30k (TorchSpec pace)",
            "online",
            servers=2,
            prefill_tok_s=30_000,
            capture_eff=1.0,
        ),
        replace(base, name="online, 2:16, sink eff 0.3", servers=2, capture_eff=0.3),
        base,
        replace(base, name="online, 4:16, sink eff 0.3", capture_eff=0.3),
        replace(base, name="online, 5:16 (balanced)", servers=5),
        replace(base, name="online, 5:16, link 25 Gbit/s", servers=5, link_gbit=25),
        replace(base, name="online, 5:16, link 400 Gbit/s", servers=5, link_gbit=400),
        replace(base, name="online, 4:16, prefill 25k", prefill_tok_s=25_000),
        replace(base, name="online, 8:16, prefill 25k", servers=8, prefill_tok_s=25_000),
        replace(base, name="online, 4:16, prefill 100k", prefill_tok_s=100_000),
        replace(base, name="online, 4:16, 1,447 tok/sample", tokens_per_sample=1_447),
        Scenario("offline, 3 epochs, disks 6 GB/s", "offline", epochs=3, disk_gb_s=6.0),
        replace(base, name="online, 3 epochs", epochs=3),
        replace(base, name="hybrid, 3 epochs, budget 50 TB", mode="hybrid", epochs=3, budget_tb=50),
        replace(base, name="hybrid, 3 epochs, budget 200 TB", mode="hybrid", epochs=3, budget_tb=200),
        replace(
            base,
            name="hybrid, 3 ep, 200 TB, disks 6 GB/s",
            mode="hybrid",
            epochs=3,
            budget_tb=200,
            disk_gb_s=6.0,
        ),
        replace(
            base,
            name="hybrid, 3 ep, 50 TB, sink eff 0.3",
            mode="hybrid",
            epochs=3,
            budget_tb=50,
            capture_eff=0.3,
        ),
    ]


def sizing_table(lines: list[str]) -> None:
    per_gpu = TRAINER_TOK_S * BYTES_PER_TOKEN
    lines.append("## Sizing, analytic (per trainer GPU at the measured 13,156 tok/s)")
    lines.append(f"features per token {BYTES_PER_TOKEN:,} B (= 56 KiB = 57.3 kB; issue 31 says 57 KB)")
    lines.append(
        f"one trainer GPU eats {per_gpu / 1e6:,.0f} MB/s = {per_gpu * 8 / 1e9:.2f} Gbit/s; "
        f"8 per host: {8 * per_gpu * 8 / 1e9:.1f} Gbit/s"
    )
    for g in (25, 100, 400):
        gpus = g * 1e9 / 8 / per_gpu
        lines.append(
            f"  a {g:>3} Gbit/s NIC feeds {gpus:5.1f} trainer GPUs "
            f"({min(1.0, gpus / 8):.0%} of an 8-GPU trainer host)"
        )
    lines.append("capture servers (8 GPUs each) per trainer GPU = 13,156 / (prefill x eff):")
    lines.append("  prefill tok/s/server   eff 0.3 (measured sink)   eff 0.9 (goal)   eff 1.0")
    for p in (12_500, 25_000, 50_000, 100_000):
        cells = [
            f"{TRAINER_TOK_S / (p * e):10.2f} ({8 * TRAINER_TOK_S / (p * e):4.1f} GPUs)"
            for e in (0.3, 0.9, 1.0)
        ]
        lines.append(f"  {p:>20,}   " + "   ".join(cells))
    total = SAMPLES * TOKENS_PER_SAMPLE
    lines.append(
        f"data: {SAMPLES:,} samples x {TOKENS_PER_SAMPLE:,} tok = {total / 1e9:.1f}B tokens = "
        f"{tb(total * BYTES_PER_TOKEN):,.0f} TB of features (at 1,447 tok/sample: "
        f"{tb(SAMPLES * 1447 * BYTES_PER_TOKEN):,.1f} TB)"
    )
    regen = total / (4 * DECODE_TOK_S) / 3600
    lines.append(
        f"regeneration (decode) of all {total / 1e9:.0f}B tokens as answers, an upper bound, at "
        f"{DECODE_TOK_S:,} output tok/s per server [public, DeepSeek-V3 8xH100]: {regen:.1f} h on 4 "
        f"servers ({regen * 32:,.0f} GPU-h); not in the simulation"
    )
    lo, hi = (8 * per_gpu / r for r in VERIFY_GB_S)
    lines.append(
        f"trainer-side verification: 8 GPUs hash {8 * per_gpu / 1e9:.1f} GB/s per host; at the measured "
        f"{VERIFY_GB_S[0] / 1e9:.1f}-{VERIFY_GB_S[1] / 1e9:.1f} GB/s read+verify (2 shared CPU cores) that is "
        f"{hi:.0f}-{lo:.0f} such streams per host"
    )
    tpu = 8 * (1e12 / BYTES_PER_TOKEN) / 3600
    lines.append(
        "recapturing 1 TB of features costs 8 x (1e12 / 57,344) / (prefill x eff) GPU-seconds: "
        f"{tpu / (50_000 * 0.9):.2f} GPU-h at 50k x 0.9, {tpu / (50_000 * 0.3):.2f} at 50k x 0.3, "
        f"{tpu / (12_500 * 0.9):.2f} at 12.5k x 0.9"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--gpu-hour-usd", type=float, default=GPU_HOUR_USD, help="[assumed] price of one GPU-hour"
    )
    args = ap.parse_args()
    lines = [
        "# .venv/bin/python benchmarks/online_sim.py > benchmarks/results/online-sim.txt",
        "# inputs: [measured] trainer 13,156 tok/s/GPU at Kimi width (train_scaling-h200-1rank.txt); disk 1.4 GB/s"
        " (capture-gpu-h200.txt); sink eff 0.26-0.37 (issue 29)",
        "# [public] 600k samples / 6B tokens, 16+16 H200, ~1,500 H200-h (TorchSpec); 52.3k input tok/s/node"
        " DeepSeek-V3 8xH100 (LMSYS)",
        f"# [assumed] prefill {PREFILL_TOK_S:,} tok/s per 8-GPU Kimi server, NIC {LINK_GBIT:.0f} Gbit/s,"
        f" ${args.gpu_hour_usd:.2f}/GPU-h, trainers scale linearly, prefetch 4 batches/GPU; regeneration"
        " (decode) not included",
        "",
    ]
    sizing_table(lines)
    lines += [
        "",
        "## Simulation (16 trainer GPUs, 8-GPU capture servers; defaults unless named)",
        f"{'scenario':<44}{'wall h':>7}{'cap h':>7}{'util':>6}{'net GB/s':>9}{'disk TB':>9}"
        f"{'queue GB':>9}{'Gb/s/host':>10}{'GPU-h':>7}{'$k':>6}  bound",
    ]
    for s in scenarios():
        r = simulate(s)
        lines.append(
            f"{s.name:<44}{r.wall_h:7.1f}{r.capture_h:7.1f}{r.util:6.0%}{r.net_gb_s:9.2f}"
            f"{r.disk_tb:9.1f}{r.queue_gb:9.1f}{r.host_gbit:10.1f}{r.gpu_h:7.0f}{r.gpu_h * args.gpu_hour_usd / 1e3:6.1f}"
            f"  {r.bound}"
        )
    lines += [
        "",
        "# util: trained tokens / (16 x 13,156 x hours the trainers are held); net GB/s: mean over the"
        " training hours; offline's capture phase writes to local disks (no network)",
        "# Gb/s/host: that traffic per receiving trainer host (2 hosts of 8 GPUs); disk TB: high-water mark,"
        " all hosts; queue GB: prefetch high-water after each step, host RAM (files on one host); 0 = trainer waits",
        "# GPU-h = capture hours x servers x 8 + training hours x 16; offline's capture and training are"
        " sequential",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
