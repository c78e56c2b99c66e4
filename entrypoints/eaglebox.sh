#!/bin/sh
# The image's one entrypoint: `extract|train|export|parity|serve|bench|check --config /configs/X.yaml [k=v ...]`.
# With several GPUs (EAGLEBOX_NPROC > 1) `train` runs under torchrun, one process a GPU.
set -e
usage() {
  echo "usage: <extract|train|export|parity|serve|bench|check> --config /configs/X.yaml [dotted.key=value ...]"
  echo "       tiny [--out DIR]    make the tiny CPU target and its chat data"
  echo "       config show /configs/X.yaml"
}
[ $# -gt 0 ] || { usage; exit 0; }
case "$1" in
  train)
    if [ "${EAGLEBOX_NPROC:-1}" -gt 1 ]; then
      exec python3 -m torch.distributed.run --standalone --nproc-per-node "$EAGLEBOX_NPROC" -m eaglebox.cli "$@"
    fi
    exec python3 -m eaglebox.cli "$@" ;;
  extract|export|parity|serve|bench|check|tiny|config)
    exec python3 -m eaglebox.cli "$@" ;;
  -h|--help|help) usage ;;
  *) echo "unknown command: $1" >&2; usage >&2; exit 2 ;;
esac
