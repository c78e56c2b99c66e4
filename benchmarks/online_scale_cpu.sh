#!/usr/bin/env bash
# Online (hybrid) training at a user's sample count on the CPU: the tiny target, 1,000 vs 10,000 samples, one
# epoch each. A cost that grows faster than the data shows here: start-up before the first step, steady
# tokens/s in the first and last tenth of the epoch, the trainer's peak RSS, the spool's high-water mark
# against the budget. Output: benchmarks/results/online-scale-cpu-2026-12-07/output.txt
#   bash benchmarks/online_scale_cpu.sh [N...]   (default 1000 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
W=/tmp/online-scale
rm -rf $W && mkdir -p $W
echo "# bash benchmarks/online_scale_cpu.sh $* (at $(git rev-parse --short HEAD), $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=1)"
for n in "${@:-1000 10000}"; do
  for N in $n; do
    /usr/bin/time -v -o $W/$N.time env OMP_NUM_THREADS=1 .venv/bin/python -m eaglebox.cli train --config configs/tiny-cpu.yaml \
      train.output_dir=$W/$N extract.output_dir=$W/$N-extract extract.max_samples=$N extract.regenerate=false \
      train.data=hybrid train.online.budget_bytes=20000000 train.epochs=1 train.heldout_share=0 train.log_every=10 \
      train.checkpoint_every=1000000 engine.port=31791 > $W/$N.log 2>&1 &
    # the trainer's own RSS (not its capture server's) every 2 s, with the step it had logged
    sleep 1; pid=$(pgrep -f "train.output_dir=$W/$N " | grep -v "^$!$" | head -1)
    while kill -0 "$pid" 2>/dev/null; do
      echo "$(awk '/VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null) $(tail -1 $W/$N/metrics.jsonl 2>/dev/null | sed -n 's/^{"step": \([0-9]*\).*/\1/p')" >> $W/$N.rss
      sleep 2
    done
    wait
    .venv/bin/python - "$W" "$N" <<'P'
import json, re, sys
w, n = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{w}/{n}/metrics.jsonl")]
tok = [r["tokens_per_s"] * r["elapsed_s"] for r in rows]
el = [r["elapsed_s"] for r in rows]
k = max(1, len(rows) // 10)
first = (tok[k] - tok[0]) / (el[k] - el[0])
last = (tok[-1] - tok[-1 - k]) / (el[-1] - el[-1 - k])
t = open(f"{w}/{n}.time").read()
wall = re.search(r"Elapsed \(wall clock\) time.*: (.*)", t).group(1)
h, m, s = ([0, 0] + [float(x) for x in wall.split(":")])[-3:]
wall_s = h * 3600 + m * 60 + s
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1)) / 1024
data = json.load(open(f"{w}/{n}/report.json"))["data"]
trace = [(int(r), int(st)) for r, st in (l.split() for l in open(f"{w}/{n}.rss") if len(l.split()) == 2)]
bounds = [rows[-1]["step"] * i // 10 for i in range(11)]
tenths = [max((r // 1024 for r, st in trace if lo < st <= hi), default=None) for lo, hi in zip(bounds, bounds[1:])]
print(f"{n} samples: {rows[-1]['step']} steps, {tok[-1]:,.0f} tokens in {el[-1]:.0f} s of training, wall {wall_s:.0f} s "
      f"(outside the loop: {wall_s - el[-1]:.0f} s); steady tokens/s first tenth {first:,.0f}, last tenth {last:,.0f} "
      f"(last/first {last / first:.2f}); peak RSS {rss:,.0f} MiB (time -v: the trainer or its capture server); "
      f"the trainer's highest RSS in each tenth of the epoch, MiB: {tenths}; data {json.dumps(data)}")
P
  done
done
