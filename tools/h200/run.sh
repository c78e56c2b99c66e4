#!/usr/bin/env bash
# On the lent H200, from the repository root: bash tools/h200/run.sh CHECK [ARGS]
# (device tool: command "bash tools/h200/run.sh parity", carry [".cache/h200/carry"]). Unpacks the
# carried SGLang closure, puts the sgl_kernel stand-in and eaglebox on the path, activates the capture
# hook and the one H200 patch in every interpreter, then runs tools/h200/checks/CHECK.py; results go
# to $OUT. EXTRA_PYTHONPATH is appended to the path (e.g. a SpecForge wheel unpacked with pip --target).
set -euo pipefail
ROOT=$PWD CARRY=$PWD/.cache/h200/carry OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site /tmp/sglk/sgl_kernel "$OUT"
[ -d /tmp/site/sglang ] || xz -dc "$CARRY/site.tar.xz" | tar xf - -C /tmp/site
cp tools/h200/sgl_kernel/__init__.py "$CARRY/scalar_type.py" /tmp/sglk/sgl_kernel/
export PYTHONPATH=/tmp/site:$ROOT/src:/tmp/sglk:$ROOT/tools/h200${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} PYTHONUNBUFFERED=1 OUT
export EAGLEBOX_SGLK_NAMES=$CARRY/sgl_kernel_names.json SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python  # the Rust radix tree misreads torch 2.11's dtypes
# after PYTHONPATH: the venv's purelib (not the base's, which python3 -S would give), and a .pth left by an
# earlier call on a warm machine then imports cleanly
PURELIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import eaglebox.capture.activate" > "$PURELIB/eaglebox_capture.pth"  # .pth files on PYTHONPATH are not read
echo "import h200_patches" > "$PURELIB/eaglebox_h200.pth"
nvidia-smi -L; python3 -c "import torch, sglang; print('torch', torch.__version__, 'sglang', sglang.__version__)"
exec python3 "tools/h200/checks/$1.py" "${@:2}"  # exec: a timeout -s INT reaches python (its finally blocks run)
