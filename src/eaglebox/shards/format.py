"""The shard format: per-sample feature files written once, by the server, and a manifest that is the
source of truth.

A shard is a group of ``shard_size`` samples:

- ``shard-NNNNN/<sample_id>.safetensors``: one sample's features as the capture server wrote them
  (``input_ids`` [L] int64, ``aux`` [L, k*H] and ``last`` [L, H] in the target's dtype, metadata with
  the rows and the sha256 of the tensor bytes). The client verifies each and renames it here from the
  staging folder: packing is a rename, so every feature byte is written once and hashed once.
- ``shard-NNNNN.safetensors``: the shard's index, small: ``input_ids`` [T] int64, ``loss_mask`` [T]
  uint8 and ``offsets`` [n+1] int64 (sample ``i`` is rows ``offsets[i]:offsets[i+1]``). The vocabulary
  pass reads only these.

``manifest.json`` records the capture header (engine, version, layer ids and their convention, the
layers the running model actually hooked), every committed shard with its index's sha256, and every
sample with its id, file, row offset and tensor sha256. A shard exists for readers only once the
manifest names it; files are written temp-then-rename, so no reader ever sees a partial file.

Readers trust nothing they do not check: opening the shards hashes each (small) index and compares
its recorded capture header and sample ids with the manifest's; reading a sample (:func:`read_sample`)
hashes its tensors against the manifest and compares its own header, rows and token ids with the
manifest's and the index's. A damaged file stops the reader naming it and :data:`REPAIR`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eaglebox.errors import EagleboxError
from eaglebox.shards.contract import CaptureSpec, describe

FORMAT = "eaglebox-shards/2"
MANIFEST = "manifest.json"
DAMAGED = "damaged"
"""Where ``eaglebox extract`` sets aside committed samples that fail verification, before capturing them again."""
REPAIR = ("run `eaglebox extract` again with the config that wrote {dir}: it re-verifies every committed sample, "
          f"moves damaged ones to {{dir}}/{DAMAGED}/ and captures them again, and rewrites damaged shard indexes")


class ShardError(EagleboxError, ValueError):
    pass


@contextmanager
def open_safetensors(path: Path, error: type[EagleboxError] = ShardError):
    """``safe_open`` that names the file: a truncated or corrupt file raises ``error`` (safetensors' own
    error names none)."""
    try:
        with safe_open(str(path), "pt") as f:
            yield f
    except SafetensorError as err:
        raise error(f"{path}: not a complete safetensors file ({err}); it was cut short or overwritten") from err


@contextmanager
def atomic_file(path: Path, *, fsync: bool = True):
    """A binary file that appears at ``path`` only once complete: written as a temp beside it
    (``.<name>.<pid>-<thread>.tmp``: two writers of one path never share a temp), renamed into place
    on success, removed on failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    """Make renames into ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


DTYPE_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.uint8: "U8", torch.int8: "I8",
                torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor; no copy when it is contiguous."""
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def tensor_sha256(tensors: dict[str, torch.Tensor | list[torch.Tensor]]) -> str:
    """sha256 over the raw bytes of the tensors (each one whole or as its dim-0 parts), in key
    order: dtype-agnostic, no copies on CPU, the same for a tensor and for its parts."""
    h = hashlib.sha256()
    for key in sorted(tensors):
        h.update(key.encode())
        for part in tensors[key] if isinstance(tensors[key], list) else [tensors[key]]:
            h.update(tensor_bytes(part))
    return h.hexdigest()


def safetensors_blobs(tensors: dict[str, list[torch.Tensor]], metadata: dict[str, str],
                      what: object = "tensors") -> tuple[list, int]:
    """A safetensors file as the buffers to write one after another (its header, then each part of each
    entry, straight from tensor memory: no joined copy) and its size. Deterministic bytes."""
    header, offset = {}, 0
    order = sorted(tensors, key=lambda k: (-tensors[k][0].element_size(), k))  # each offset aligned
    for key in order:
        parts = tensors[key]
        first = parts[0]
        if any(q.dtype != first.dtype or q.shape[1:] != first.shape[1:] for q in parts):
            raise ValueError(f"{what}: the parts of {key!r} differ in dtype or trailing shape")
        size = sum(q.numel() for q in parts) * first.element_size()
        header[key] = {"dtype": DTYPE_CODES[first.dtype], "shape": [sum(q.shape[0] for q in parts), *first.shape[1:]],
                       "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = metadata
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    blobs = [struct.pack("<Q", len(blob)), blob, *(tensor_bytes(q) for k in order for q in tensors[k])]
    return blobs, 8 + len(blob) + offset


def write_safetensors(path: Path, tensors: dict[str, list[torch.Tensor]], metadata: dict[str, str], *,
                      fsync: bool, file_digest: bool = True) -> tuple[str | None, int]:
    """Write a safetensors file straight from tensor memory; returns the file's sha256 (None unless
    ``file_digest``: hashing is a pass over every byte) and size.

    Each entry is the concatenation (dim 0) of its parts, written part after part (:func:`safetensors_blobs`):
    no joined copy and no serialised copy of the file, both of which safetensors' own ``save`` makes while
    holding the GIL (which the capture writer shares with SGLang's scheduler). Deterministic bytes; atomic
    (temp + rename, the temp removed on failure)."""
    blobs, size = safetensors_blobs(tensors, metadata, path)
    h = hashlib.sha256() if file_digest else None
    with atomic_file(path, fsync=fsync) as f:
        for b in blobs:
            f.write(b)
            if h is not None:
                h.update(b)
    return h.hexdigest() if h is not None else None, size


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def shard_name(index: int) -> str:
    """The shard's index file; its samples live in the folder of the same stem."""
    return f"shard-{index:05d}.safetensors"


def shard_dir(index: int) -> str:
    return f"shard-{index:05d}"


class DamagedSample(ShardError):
    """A committed sample that is not what the manifest says it is (its message names the file and why)."""


CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
SAMPLE_KEYS = ("aux", "input_ids", "last")


def read_sample(path: Path, sha256: str, rows: int, capture: CaptureSpec) -> dict[str, torch.Tensor]:
    """A committed sample's ``input_ids``, ``aux`` and ``last``, read whole (one read into one buffer,
    the tensors are views of it) and verified: the tensors' sha256 is ``sha256`` (the manifest's), its
    header agrees with ``capture`` (:meth:`CaptureSpec.diff_sample_header`), it has ``rows`` rows. sha256 releases the GIL
    on these buffers, so loader threads verify in parallel. The buffer is ``torch.empty``'s, not a
    ``bytearray``: that zeroes the whole sample with the GIL held, which stalls the training step's
    thread (docs/measurements.md, "Measurements behind the code"). Raises :class:`DamagedSample`."""
    try:
        size = path.stat().st_size
        buf = torch.empty(size, dtype=torch.uint8).numpy()  # pages faulted in by readinto, GIL released
        with open(path, "rb", buffering=0) as f:
            got = f.readinto(buf)
    except OSError as err:
        raise DamagedSample(f"{path}: cannot be read ({err.strerror})") from err
    try:
        n = struct.unpack_from("<Q", buf)[0]
        if got != size or 8 + n > size:
            raise ValueError(f"its header needs {8 + n} bytes")
        header = json.loads(bytes(buf[8 : 8 + n]))
        meta = header.pop("__metadata__", {})
        entries = {k: header[k] for k in SAMPLE_KEYS}
        end = max(e["data_offsets"][1] for e in header.values())
        if 8 + n + end != size:
            raise ValueError(f"its header describes {8 + n + end} bytes")
    except (struct.error, ValueError, KeyError, TypeError) as err:
        raise DamagedSample(f"{path}: not a complete sample file ({size} bytes; {err}): cut short or overwritten") from None
    data = memoryview(buf)[8 + n :]
    h = hashlib.sha256()
    for key in SAMPLE_KEYS:  # tensor_sha256's order and bytes
        a, b = entries[key]["data_offsets"]
        h.update(key.encode())
        h.update(data[a:b])
    if h.hexdigest() != sha256:
        raise DamagedSample(f"{path}: its tensors' sha256 differs from {MANIFEST}: the file changed after capture")
    if diffs := capture.diff_sample_header(json.loads(meta.get("header", "{}"))):
        raise DamagedSample(f"{path}: the capture server recorded {describe(diffs, 1)}, {MANIFEST} says "
                            f"{describe(diffs, 0)}")
    out = {}
    for key in SAMPLE_KEYS:
        e = entries[key]
        a, b = e["data_offsets"]
        dtype = CODE_DTYPES[e["dtype"]]
        out[key] = torch.frombuffer(buf, dtype=dtype, count=(b - a) // dtype.itemsize, offset=8 + n + a).view(e["shape"])
    if not out["input_ids"].shape[0] == out["aux"].shape[0] == out["last"].shape[0] == rows:
        raise DamagedSample(f"{path}: {out['input_ids'].shape[0]} token ids, {out['aux'].shape[0]} aux and "
                            f"{out['last'].shape[0]} last rows; {MANIFEST} says {rows}")
    return out


def write_index(path: Path, ids: list[list[int]], masks: list[list[int]], sample_ids: list[str],
                capture: CaptureSpec) -> tuple[str, int]:
    """Write a shard's index; deterministic (no timestamps), so a rerun gives identical bytes.
    Returns the file's sha256 and size."""
    offsets = [0]
    for x in ids:
        offsets.append(offsets[-1] + len(x))
    tensors = {
        "input_ids": [torch.tensor(x, dtype=torch.int64) for x in ids],
        "loss_mask": [torch.tensor(m, dtype=torch.uint8) for m in masks],
        "offsets": [torch.tensor(offsets, dtype=torch.int64)],
    }
    meta = {"eaglebox": json.dumps({"format": FORMAT, "header": capture.as_json(), "sample_ids": sample_ids}, sort_keys=True)}
    return write_safetensors(path, tensors, meta, fsync=True)


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
    shards = [(s["file"], s["sha256"], [x["sha256"] for x in s["samples"]]) for s in manifest["shards"]]
    return hashlib.sha256(json.dumps([manifest["capture"], shards], sort_keys=True).encode()).hexdigest()


def samples_digest(capture: CaptureSpec, samples: list[tuple[str, list[int]]]) -> str:
    """Identifies the data of a run whose features do not exist yet (``train.data: online | hybrid``): the
    capture spec and each sample's (id, loss mask) in order; the id is a content address of the token ids
    and the spec. A checkpoint records it, so a resume trains on the same samples in the same order."""
    h = hashlib.sha256(capture.digest_json().encode())
    for sid, mask in samples:
        h.update(sid.encode())
        h.update(bytes(mask))
    return h.hexdigest()


class DamagedIndex(ShardError):
    """A shard index missing or changed after capture. Its message carries no advice: a reader adds
    :data:`REPAIR`, while ``eaglebox extract``, which is that repair, says it commits the shard again."""


def check_index(path: Path, shard: dict, capture: CaptureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """A shard's index, checked against its manifest entry ``shard`` and the manifest's ``capture``: its
    sha256 (:class:`DamagedIndex`), the capture header and sample ids it records, its sample offsets.
    Returns its token ids and loss mask."""
    if not path.exists():
        raise DamagedIndex(f"{path}: listed in {MANIFEST} but missing")
    if file_sha256(path) != shard["sha256"]:
        raise DamagedIndex(f"{path}: sha256 differs from {MANIFEST}: the file changed after capture")
    with open_safetensors(path) as f:
        recorded = json.loads(f.metadata().get("eaglebox", "{}"))
        ids, mask, offsets = (f.get_tensor(k) for k in ("input_ids", "loss_mask", "offsets"))
    if diffs := capture.diff(recorded.get("header") or {}):
        raise ShardError(f"{path}: records the capture {describe(diffs, 1)}; {MANIFEST} claims {describe(diffs, 0)}: "
                         "the manifest was edited or belongs to other shards; extract again into an empty "
                         "extract.output_dir")
    samples = shard["samples"]
    want = [s["offset"] for s in samples] + [samples[-1]["offset"] + samples[-1]["rows"] if samples else 0]
    if recorded.get("sample_ids") != [s["id"] for s in samples] or offsets.tolist() != want:
        raise ShardError(f"{path}: its sample ids or offsets differ from {MANIFEST}'s entry for it: the manifest was "
                         "edited or belongs to other shards; extract again into an empty extract.output_dir")
    return ids, mask


class ShardReader:
    """Random access to samples across the shards a manifest names. The shards' indexes (ids and
    loss masks) are checked (:func:`check_index`) and held in memory; each feature read is verified
    (:func:`read_sample`). ``verify`` also verifies every sample at once, ``threads`` at a time."""

    def __init__(self, out_dir: str | Path, *, verify: bool = False, threads: int = 8):
        self.dir = Path(out_dir)
        manifest = load_manifest(self.dir)
        if manifest is None:
            raise ShardError(f"{self.dir}: no {MANIFEST}; run `eaglebox extract` first")
        self.manifest = manifest
        self.capture = CaptureSpec.load(manifest["capture"], self.dir / MANIFEST)
        self.header = manifest["capture"]  # as recorded: bench/parity.py and tools/h200 still read it by key
        self.index: list[tuple[Path, int, int, int, str]] = []  # (sample file, shard, row offset, rows, sha256)
        self._ids, self._masks = [], []
        for si, shard in enumerate(manifest["shards"]):
            try:
                ids, mask = check_index(self.dir / shard["file"], shard, self.capture)
            except DamagedIndex as err:
                raise ShardError(f"{err}; {REPAIR.format(dir=self.dir)}") from None
            self._ids.append(ids)
            self._masks.append(mask)
            for s in shard["samples"]:
                sample = self.dir / s["file"]
                if not sample.exists():
                    raise ShardError(f"{sample}: listed in {MANIFEST} but missing; {REPAIR.format(dir=self.dir)}")
                self.index.append((sample, si, s["offset"], s["rows"], s["sha256"]))
        if verify:
            with ThreadPoolExecutor(threads) as pool:
                for _ in pool.map(self.get, range(len(self))):
                    pass

    def __len__(self) -> int:
        return len(self.index)

    def digest(self) -> str:
        """What the trainer's checkpoints and the draft's provenance record as its data."""
        return manifest_digest(self.manifest)

    def report(self) -> dict:
        return {"data": "offline", "shards": str(self.dir)}

    def rows(self, i: int) -> int:
        return self.index[i][3]

    def ids_and_mask(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``i``'s token ids and loss mask, from the shard index (no feature bytes read)."""
        _, si, off, n, _ = self.index[i]
        return self._ids[si][off : off + n], self._masks[si][off : off + n]

    def get(self, i: int, max_rows: int | None = None) -> dict[str, torch.Tensor]:
        """Sample ``i``, read whole and verified (:func:`read_sample`; its token ids also against the
        index's), cut to ``max_rows``. A damaged file raises :class:`ShardError` naming it and the repair."""
        path, _, _, n, sha256 = self.index[i]
        ids, mask = self.ids_and_mask(i)
        try:
            s = read_sample(path, sha256, n, self.capture)
            if not torch.equal(s["input_ids"], ids):
                raise DamagedSample(f"{path}: its token ids differ from its shard index's")
        except DamagedSample as err:
            raise ShardError(f"{err}; {REPAIR.format(dir=self.dir)}") from None
        n = min(n, max_rows) if max_rows else n
        return {"input_ids": ids[:n], "loss_mask": mask[:n], "aux": s["aux"][:n], "last": s["last"][:n]}

    def get_many(self, indices: list[int], max_rows: int | None = None) -> list[dict[str, torch.Tensor]]:
        """:meth:`get` of each of ``indices``, in order: a batch (the online reader sends a batch at once)."""
        return [self.get(i, max_rows) for i in indices]
