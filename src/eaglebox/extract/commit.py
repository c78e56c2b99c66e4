"""Committing: each staged sample verified against what was sent (its header, ids, widths, dtype and the
health of its features), renamed into its shard's folder, the shard's index written, the shard recorded in
the manifest; and a resumed run's committed shards verified again."""

from __future__ import annotations

import bisect
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from eaglebox.config.schema import ExtractConfig
from eaglebox.extract import ExtractError
from eaglebox.extract.plan import Planned
from eaglebox.shards.contract import CaptureSpec, describe
from eaglebox.shards.format import (
    DAMAGED,
    DTYPE_CODES,
    MANIFEST,
    DamagedSample,
    ShardError,
    check_index,
    fsync_dir,
    open_safetensors,
    read_sample,
    save_manifest,
    shard_dir,
    shard_name,
    write_index,
)
from eaglebox.target.weights import load_embedding

STAGING = ".staging"


def staging_dir(e: ExtractConfig) -> Path:
    """Where the capture server writes samples before the client commits them to shards."""
    return Path(e.output_dir) / STAGING
MANIFEST_SAVE_SHARE = 8
"""The manifest (every sample's entry) is rewritten after a shard once the samples committed since its
last write are at least 1/8 of all it records, and at the end (or on an error): the bytes written stay
under ~9x the final manifest, where rewriting it after every shard is quadratic in the samples
(docs/measurements.md, "Measurements behind the code"). A shard committed but
not yet recorded when the client is killed is committed again by the next run from its shard folder
(its samples are not captured again; see ``commit_shard``)."""


class ManifestLedger:
    """The manifest of a run in progress: each committed shard is recorded in it at once, and the
    file rewritten on :data:`MANIFEST_SAVE_SHARE`'s cadence (``unsaved``: the samples committed since
    the last write)."""

    def __init__(self, out: Path, manifest: dict):
        self.out, self.manifest = out, manifest
        manifest["samples"] = sum(len(s["samples"]) for s in manifest["shards"])
        manifest["tokens"] = sum(r["rows"] for s in manifest["shards"] for r in s["samples"])
        self.unsaved = 0

    def save(self) -> None:
        save_manifest(self.out, self.manifest)
        self.unsaved = 0

    def record(self, entry: dict) -> None:
        """Add a committed shard's entry (:func:`commit_shard`), in shard order; rewrite the file when due."""
        manifest = self.manifest
        bisect.insort(manifest["shards"], entry, key=lambda s: s["file"])
        manifest["samples"] += len(entry["samples"])
        manifest["tokens"] += sum(r["rows"] for r in entry["samples"])
        self.unsaved += len(entry["samples"])
        if self.unsaved * MANIFEST_SAVE_SHARE >= manifest["samples"]:
            self.save()

    def save_after_error(self) -> None:
        """What was committed is recorded (a rerun would commit it again, from its shard folder)."""
        if self.unsaved:
            try:
                self.save()
            except OSError:
                pass  # the disk that failed; the manifest on disk is the last whole one


def set_aside_damaged(out: Path, manifest: dict, threads: int, log=print) -> list[str]:
    """Verify every committed shard of a resumed run: its index (:func:`check_index`) and each of its
    samples, read whole (:func:`read_sample`), ``threads`` at a time. A damaged sample is moved to
    ``out/damaged/`` (kept for inspection, out of the way of its recapture); returns the shards to
    capture again (their intact samples are reused)."""
    samples = [(shard, s) for shard in manifest["shards"] for s in shard["samples"]]
    if not samples:
        return []
    capture = CaptureSpec.load(manifest["capture"], out / MANIFEST)

    def damage(item) -> str | None:
        _, s = item
        try:
            read_sample(out / s["file"], s["sha256"], s["rows"], capture)
        except DamagedSample as err:
            return str(err)
        return None

    t0 = time.monotonic()
    redo = set()
    for shard in manifest["shards"]:
        try:
            check_index(out / shard["file"], shard, capture)
        except ShardError as err:
            log(f"extract: {err}; shard {shard['file']} will be committed again")
            redo.add(shard["file"])
    with ThreadPoolExecutor(threads) as pool:
        for (shard, s), why in zip(samples, pool.map(damage, samples)):
            if why is None:
                continue
            path, aside = out / s["file"], out / DAMAGED / s["file"]
            if path.exists():
                aside.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, aside)
                why += f"; moved to {aside}"
            log(f"extract: {why}; it will be captured again")
            redo.add(shard["file"])
    log(f"extract: verified the {len(samples)} committed samples in {time.monotonic() - t0:.1f} s; "
        f"{len(redo)} shards to commit again")
    return sorted(redo)



def drop_partial_files(folder: Path) -> None:
    """Delete the temporaries of capture writers killed mid-file: their samples are captured again."""
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def wait_for_files(files: list[tuple[Path, str]], wait_s: float = 120, alive=lambda: True) -> None:
    """Wait until the server's writer has renamed each (file, what it is) into place; a server that exits
    meanwhile (``alive`` false) ends the wait at once instead of after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    for path, what in files:
        while not path.exists():
            if not alive():
                raise ExtractError(f"{what}: the SGLang server exited before it wrote {path}")
            if time.monotonic() > deadline:
                raise ExtractError(f"{what}: {path} did not appear within {wait_s:.0f} s of its answer")
            time.sleep(0.005)


class IncompleteSample(ExtractError):
    """A sample file cut short or overwritten: not a safetensors file any more."""


def verify_staged(path: Path, p: Planned, spec: CaptureSpec, bound: float | None = None) -> str:
    """Check one staged sample against what was sent, from its header and token ids (no feature bytes
    read), and its features' health from the largest values the server recorded (:func:`check_health`);
    returns the tensor sha256 the server computed as it wrote the file."""
    with open_safetensors(path, IncompleteSample) as f:
        meta = f.metadata()
        ids = f.get_tensor("input_ids").tolist()
        aux, last = f.get_slice("aux"), f.get_slice("last")
        shapes, dtypes = (aux.get_shape(), last.get_shape()), {aux.get_dtype(), last.get_dtype()}
    if diffs := spec.diff_sample_header(json.loads(meta.get("header", "{}"))):
        raise ExtractError(f"{path}: the server reports {describe(diffs, 1)}, the capture spec says "
                           f"{describe(diffs, 0)}; the running SGLang hooks other layers, is another build or "
                           "was launched for another spec")
    if ids != p.input_ids:
        raise ExtractError(f"{path}: the server ran other token ids than were sent for line {p.line}")
    if not (shapes[0][0] == shapes[1][0] == len(p.input_ids)):
        raise ExtractError(f"{path}: {shapes[0][0]} rows for a {len(p.input_ids)}-token prompt")
    H, k = spec.hidden_size, len(spec.layers.layer_ids)
    if shapes[0][1] != k * H or shapes[1][1] != H or dtypes != {DTYPE_CODES[getattr(torch, spec.dtype)]}:
        raise ExtractError(f"{path}: aux {shapes[0]} / last {shapes[1]} {sorted(dtypes)} do not match the capture "
                           f"spec ({k} x {H}, {spec.dtype})")
    digest = meta.get("sha256", "")
    if len(digest) != 64 or "max_abs" not in meta:
        raise ExtractError(f"{path}: no tensor sha256 or max_abs in its metadata; it was not written by this "
                           f"eaglebox's capture hook (remove {path.parent} and run the command again)")
    check_health(path, json.loads(meta["max_abs"]), spec, bound)
    return digest


HEALTH_FACTOR = 1e7
"""Captured features above this multiple of the target's largest embedding value are garbage: a
trained model's residual stream stays far below it (the tiny target's within 10x; the massive
activations of large models, ~1e3-1e4, within ~1e5x of embeddings whose largest values are ~0.1-1),
a miscomputing kernel need not (2e9 where the tiny target's real values stay under 3). Loose on
purpose: a false alarm would stop a correct capture."""


def feature_bound(model_path: Path) -> float:
    """The largest |feature| a capture of this target may hold (:data:`HEALTH_FACTOR`)."""
    return HEALTH_FACTOR * float(load_embedding(model_path).abs().max())


def check_health(path: Path, max_abs: list[float], spec: CaptureSpec, bound: float | None) -> None:
    """Refuse a sample whose features a correct forward cannot have produced: a non-finite or all-zero
    layer, or one beyond ``bound`` (:func:`feature_bound`; None: not checked)."""
    names = [f"the input of layer {i}" for i in spec.layers.captured_layer_inputs] + ["the last hidden state"]
    opts = spec.engine_options
    # a backend set through engine.extra_args (e.g. --prefill-attention-backend) overrides the keyed one
    chosen = [f"{k} {v}" for k, v in (opts.extra_args or {}).items() if k.endswith("attention_backend")]
    cause = (f"likely cause: the engine computes this target wrongly with attention backend "
             f"{opts.attention_backend or 'SGLang default'}{''.join(', ' + c for c in chosen)} in {opts.dtype}"
             f"{', kv cache ' + opts.kv_cache_dtype if opts.kv_cache_dtype else ''}"
             f"{', quantization ' + opts.quantization if opts.quantization else ''}; compare a few "
             "samples with `eaglebox parity`, try another engine.attention_backend or model.dtype=float32")
    for name, v in zip(names, max_abs):
        if not math.isfinite(v):
            raise ExtractError(f"{path}: captured features of {name} are not finite ({v}); {cause}")
        if v == 0:
            raise ExtractError(f"{path}: captured features of {name} are all zero; {cause}")
        if bound is not None and v > bound:
            raise ExtractError(f"{path}: captured features of {name} reach {v:.3g}, beyond {bound:.3g} "
                               f"({HEALTH_FACTOR:.0e} x the target's largest embedding value); {cause}")


def check_left_in_folder(path: Path, p: Planned, spec: CaptureSpec, bound: float | None) -> str:
    """A sample an interrupted run moved into its shard folder but never listed: its bytes are read and
    hashed, since the hash it carries vouches only for what was written, not for what is there now.
    Returns its tensor sha256, as :func:`verify_staged` does."""
    try:
        digest = verify_staged(path, p, spec, bound)
        read_sample(path, digest, len(p.input_ids), spec)
    except (IncompleteSample, DamagedSample) as err:
        raise ExtractError(f"{path}: left in its shard folder by an interrupted run and damaged since ({err}); "
                           f"delete it and run `eaglebox extract` again: its sample is captured anew") from None
    return digest


def commit_shard(out: Path, index: int, shard: list[Planned], staging: Path, spec: CaptureSpec,
                 bound: float | None = None) -> dict:
    """Verify each sample (``bound``: :func:`check_health`'s) and rename it into the shard's folder,
    then write the shard's index."""
    folder = out / shard_dir(index)
    folder.mkdir(exist_ok=True)
    entries, offset = [], 0
    for p in shard:
        final = folder / f"{p.id}.safetensors"
        src = final if final.exists() else staging / f"{p.id}.safetensors"  # moved by an interrupted run
        if src == final:
            digest = check_left_in_folder(final, p, spec, bound)
        else:
            digest = verify_staged(src, p, spec, bound)
            os.replace(src, final)
        entries.append({"id": p.id, "line": p.line, "file": f"{folder.name}/{final.name}", "offset": offset,
                        "rows": len(p.input_ids), "loss_tokens": int(sum(p.loss_mask)), "sha256": digest})
        offset += len(p.input_ids)
    fsync_dir(folder)
    path = out / shard_name(index)
    digest, size = write_index(path, [p.input_ids for p in shard], [p.loss_mask for p in shard],
                               [p.id for p in shard], spec)
    return {"file": path.name, "sha256": digest, "bytes": size, "samples": entries}
