#!/usr/bin/env bash
# Online training fed by SGLang data parallelism (model.dp=2: one URL, two schedulers) vs offline on the same
# 16 samples of the tiny target, on the CPU: prints both loss curves and how many prefill batches each DP rank ran.
# Output: benchmarks/results/online-dp2-cpu-2026-12-07/output.txt
set -e
cd "$(dirname "$0")/.."
rm -rf /tmp/dpo && mkdir -p /tmp/dpo
S="extract.max_samples=16 extract.max_length=320 extract.regenerate_temperature=0 extract.regenerate_repetition_penalty=1"
C="train.batch_size=4 train.max_length=320 train.log_every=1 train.ttt_length=3 train.max_steps=8 train.epochs=2 train.warmup_steps=2 train.heldout_share=0 train.checkpoint_every=4"
.venv/bin/python -m eaglebox.cli extract --config configs/tiny-cpu.yaml extract.output_dir=/tmp/dpo/shards $S engine.port=31781 > /tmp/dpo/extract.log 2>&1
.venv/bin/python -m eaglebox.cli train --config configs/tiny-cpu.yaml train.output_dir=/tmp/dpo/offline extract.output_dir=/tmp/dpo/shards $S $C > /tmp/dpo/offline.log 2>&1
mkdir -p /tmp/dpo/extract2 && cp /tmp/dpo/shards/regenerated.jsonl /tmp/dpo/extract2/
SGLANG_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python -m eaglebox.cli train --config configs/tiny-cpu.yaml train.output_dir=/tmp/dpo/online extract.output_dir=/tmp/dpo/extract2 $S $C train.data=online model.dp=2 engine.port=31783 > /tmp/dpo/online.log 2>&1
python3 - <<'P'
import json
a=[json.loads(l)["loss"] for l in open('/tmp/dpo/offline/metrics.jsonl')]
b=[json.loads(l)["loss"] for l in open('/tmp/dpo/online/metrics.jsonl')]
print("offline", a); print("online model.dp=2", b); print("equal", a==b)
P
grep -o "DP[01]\] Prefill batch" /tmp/dpo/online/capture-server.log | sort | uniq -c
