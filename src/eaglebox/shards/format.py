"""The shard format: safetensors files of many samples, and a manifest that is the source of truth.

A shard concatenates its samples along the token axis:

- ``input_ids`` [T] int64, ``loss_mask`` [T] uint8,
- ``aux`` [T, k*H] and ``last`` [T, H] in the target's dtype,
- ``offsets`` [n+1] int64: sample ``i`` is rows ``offsets[i]:offsets[i+1]``.

``manifest.json`` records the capture header (engine, version, layer ids and their convention, the
layers the running model actually hooked), every committed shard with its sha256, and every sample
with its id, shard, row offset and sha256. A shard exists for readers only once the manifest names
it; both are written temp-then-rename, so no reader ever sees a partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save

from eaglebox.errors import EagleboxError

FORMAT = "eaglebox-shards/1"
MANIFEST = "manifest.json"


class ShardError(EagleboxError, ValueError):
    pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


@dataclass
class Sample:
    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor


def encode_shard(samples: list[Sample], header: dict) -> bytes:
    """Serialise samples; deterministic (no timestamps), so a rerun gives identical bytes."""
    offsets = [0]
    for s in samples:
        offsets.append(offsets[-1] + s.input_ids.numel())
    tensors = {
        "input_ids": torch.cat([s.input_ids.to(torch.int64) for s in samples]),
        "loss_mask": torch.cat([s.loss_mask.to(torch.uint8) for s in samples]),
        "aux": torch.cat([s.aux for s in samples]),
        "last": torch.cat([s.last for s in samples]),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }
    # one metadata key: safetensors writes several in hash-map order, which changes between processes
    meta = {"eaglebox": json.dumps({"format": FORMAT, "header": header, "sample_ids": [s.id for s in samples]},
                                   sort_keys=True)}
    return st_save(tensors, metadata=meta)


def load_manifest(out_dir: Path) -> dict | None:
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ShardError(f"{path}: not valid JSON ({err})") from err
    if manifest.get("format") != FORMAT:
        raise ShardError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def save_manifest(out_dir: Path, manifest: dict) -> None:
    atomic_write_bytes(Path(out_dir) / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def manifest_digest(manifest: dict) -> str:
    """Identifies the data a draft was trained on (recorded in the draft's provenance)."""
    shards = [(s["file"], s["sha256"]) for s in manifest["shards"]]
    return hashlib.sha256(json.dumps([manifest["capture"], shards], sort_keys=True).encode()).hexdigest()


class ShardReader:
    """Random access to samples across the shards a manifest names (memory-mapped by safetensors)."""

    def __init__(self, out_dir: str | Path, *, verify: bool = False):
        self.dir = Path(out_dir)
        manifest = load_manifest(self.dir)
        if manifest is None:
            raise ShardError(f"{self.dir}: no {MANIFEST}; run `eaglebox extract` first")
        self.manifest = manifest
        self.header = manifest["capture"]
        self.index: list[tuple[int, int, int]] = []  # (shard, row offset, rows)
        self._files = []
        for si, shard in enumerate(manifest["shards"]):
            path = self.dir / shard["file"]
            if not path.exists():
                raise ShardError(f"{path}: listed in {MANIFEST} but missing")
            if verify and file_sha256(path) != shard["sha256"]:
                raise ShardError(f"{path}: sha256 differs from {MANIFEST}")
            self._files.append(safe_open(str(path), "pt"))
            for s in shard["samples"]:
                self.index.append((si, s["offset"], s["rows"]))

    def __len__(self) -> int:
        return len(self.index)

    def rows(self, i: int) -> int:
        return self.index[i][2]

    def get(self, i: int, max_rows: int | None = None) -> dict[str, torch.Tensor]:
        si, off, n = self.index[i]
        n = min(n, max_rows) if max_rows else n
        f = self._files[si]
        return {k: f.get_slice(k)[off : off + n] for k in ("input_ids", "loss_mask", "aux", "last")}
