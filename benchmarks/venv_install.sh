#!/usr/bin/env bash
# `make venv`'s package install, pip vs uv, side by side: ROUNDS rounds (default 3), each installing the
# venv's requirement lists into a fresh venv with no download cache, first with pip then with uv.
# Prints each round's wall times and the median and worst ratio. Network-bound: run it alone.
#   bash benchmarks/venv_install.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3} UV_VERSION=0.13.9 WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
REQS=(-r requirements/sglang-0.5.23-runtime.txt -r requirements/dev.txt)
python3 -m venv "$WORK/tool" && "$WORK/tool/bin/pip" install -q "uv==$UV_VERSION"
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(python3 --version), pip $(python3 -m pip --version | cut -d' ' -f2), uv $UV_VERSION"
for r in $(seq "$ROUNDS"); do
  rm -rf "$WORK/pip" "$WORK/uv"
  t0=$(date +%s.%N)
  python3 -m venv "$WORK/pip" && "$WORK/pip/bin/pip" install -q --no-cache-dir "${REQS[@]}"
  t1=$(date +%s.%N)
  "$WORK/tool/bin/uv" venv -q -p python3 "$WORK/uv" && VIRTUAL_ENV="$WORK/uv" "$WORK/tool/bin/uv" pip install -q --no-cache "${REQS[@]}"
  t2=$(date +%s.%N)
  echo "round $r: pip $(python3 -c "print(round($t1 - $t0, 1))") s, uv $(python3 -c "print(round($t2 - $t1, 1))") s" | tee -a "$WORK/rounds"
done
python3 - "$WORK/rounds" <<'PY'
import re, statistics, sys
rows = [tuple(map(float, re.findall(r"([\d.]+) s", line))) for line in open(sys.argv[1])]
ratios = [p / u for p, u in rows]
print(f"pip / uv: median {statistics.median(ratios):.2f}x, worst round {min(ratios):.2f}x over {len(rows)} rounds; "
      f"pip median {statistics.median(p for p, _ in rows):.0f} s, uv median {statistics.median(u for _, u in rows):.0f} s")
PY
