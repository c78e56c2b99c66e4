#!/usr/bin/env python3
"""Refuse `make test` up front when a disk cannot hold what its set-up will write.

    space-check.py [VENV]

Without it a full disk shows 1-2 minutes in as a pip traceback from one of the set-up phases running side
by side (CI, 2026-12-07: "No space left on device" in .cache/wheels and .cache/gpu-wheels). Counts only
what is not there yet (a phase's completion marker, the CPU image), adds it up per file system and names
each item. Sizes measured from nothing on 2026-12-07 (du -sm; docker system df)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

GB = 1e9
RUNS_BYTES = 2 * GB  # the suite's runs, spools and temporary folders
IMAGE_BYTES = 11.5 * GB  # the CPU image (7.8 GB) and its build cache (3.4 GB), with the Debian base
IMAGE = "eaglebox:cpu"


def items(venv: str) -> list[tuple[str, Path, Path, float]]:
    """(what, the folder it is written to, the marker that says it is complete, bytes)."""
    return [
        # 7.4 GB, and Mooncake's store (0.14 GB, train.online.transport: mooncake)
        ("the venv (torch, SGLang and their libraries)", Path(venv), Path(venv, ".eaglebox-installed"), 7.55 * GB),
        ("the CPU image's wheels", Path(".cache/wheels"), Path(".cache/wheels/.complete"), 3.3 * GB),
        # pip unpacks each wheel in the temporary folder before copying it: the largest is 0.55 GB.
        ("the GPU closure's wheels", Path(".cache/gpu-wheels"), Path(".cache/gpu-wheels/.downloaded"), 4.8 * GB),
    ]


def existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def docker_needs() -> tuple[Path, float]:
    """The engine's root folder and what the image build adds there (nothing once the image exists)."""
    docker = shutil.which("docker")
    if docker:
        info = subprocess.run([docker, "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True)
        if info.returncode == 0 and info.stdout.strip():
            have = subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True).returncode == 0
            return Path(info.stdout.strip()), 0.0 if have else IMAGE_BYTES
    return Path("/var/lib/docker"), IMAGE_BYTES


def shortfalls(venv: str) -> list[str]:
    needs: dict[int, list] = {}

    def add(what: str, path: Path, size: float) -> None:
        where = existing_parent(path.resolve())
        needs.setdefault(os.stat(where).st_dev, [where, []])[1].append((what, size))

    for what, path, marker, size in items(venv):
        if not marker.exists():
            add(what, path, size)
    add("the suite's runs and temporary files", Path("runs"), RUNS_BYTES)
    root, size = docker_needs()
    if size:
        add(f"the Docker image {IMAGE} and its build cache ({root})", root, size)
    errors = []
    for where, wants in needs.values():
        free = shutil.disk_usage(where).free
        total = sum(size for _, size in wants)
        if free < total:
            listed = "; ".join(f"{what} {size / GB:.1f} GB" for what, size in wants)
            errors.append(f"make test: the file system of {where} has {free / GB:.1f} GB free and the set-up "
                          f"needs about {total / GB:.1f} GB there: {listed}. Free some space (docker image "
                          f"prune, old clones' .venv and .cache) and run make test again.")
    return errors


if __name__ == "__main__":
    problems = shortfalls(sys.argv[1] if len(sys.argv) > 1 else ".venv")
    sys.exit("\n".join(problems) if problems else None)
