"""Planning: data set rows -> the samples to capture, in data-set order, and everything about them that can
fail before a server starts (bad rows, tokenization, a resume into another capture spec, the disk)."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglebox.config.schema import ExtractConfig
from eaglebox.extract import ExtractError
from eaglebox.extract.dataset import BadRow, Row, read_chat_template, read_rows, tokenize
from eaglebox.shards.contract import CaptureSpec, describe
from eaglebox.shards.format import load_manifest, shard_name


@dataclass
class Planned:
    id: str
    line: int
    input_ids: list[int]
    loss_mask: list[int]


def sample_id(input_ids: list[int], spec: CaptureSpec) -> str:
    """Content address: the token ids plus the capture spec (layers, engine and its version)."""
    h = hashlib.sha256(spec.digest_json().encode())
    h.update(torch.tensor(input_ids, dtype=torch.int64).numpy().tobytes())
    return h.hexdigest()[:32]


def bytes_per_token(hidden: int, n_aux: int, dtype_bytes: int) -> int:
    """Shard bytes a token costs: aux (k*H) + last (H) in the target dtype, its id and mask byte."""
    return (n_aux + 1) * hidden * dtype_bytes + 8 + 1


def check_disk(out_dir: Path, tokens: int, bpt: int) -> None:
    """Staged samples are renamed into their shards, so the features' bytes are all there is."""
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    need = tokens * bpt
    free = shutil.disk_usage(probe).free
    if need > free:
        raise ExtractError(
            f"not enough disk at {probe}: the capture needs {need / 1e9:.2f} GB ({tokens:,} tokens x {bpt:,} "
            f"bytes/token), {free / 1e9:.2f} GB are free")


def select_rows(e: ExtractConfig, log=print) -> list[Row]:
    """Parse the data set; bad rows fail the run or are skipped (``extract.on_bad_row``)."""
    rows, skipped = [], 0
    for row in read_rows(e.dataset, e.format, e.max_row_bytes or 64 * e.max_length):
        if isinstance(row, BadRow):
            _bad(e, row, log)
            skipped += 1
            continue
        rows.append(row)
        if e.max_samples and len(rows) >= e.max_samples:
            break
    if skipped:
        log(f"skipped {skipped} malformed rows")
    return rows


def _bad(e, bad: BadRow, log) -> None:
    if e.on_bad_row == "error":
        raise ExtractError(f"{bad} (set extract.on_bad_row=skip to skip such rows)")
    log(f"skipping {bad}")


def plan_samples(e: ExtractConfig, rows: list[Row], tokenizer, spec: CaptureSpec, log=print) -> list[Planned]:
    """Tokenize (assistant-only loss mask), drop over-long rows and duplicates, in data-set order."""
    template = read_chat_template(e.chat_template)
    planned, seen, dupes = [], set(), 0
    for row in rows:
        try:
            ids, mask = tokenize(row, tokenizer, template)
        except ValueError as err:
            raise ExtractError(f"{e.dataset}: line {row.line}: {err}") from err
        if len(ids) > e.max_length:
            _bad(e, BadRow(Path(e.dataset), row.line, f"{len(ids)} tokens, over extract.max_length={e.max_length}"), log)
            continue
        if sum(mask) == 0:
            log(f"skipping {e.dataset}: line {row.line}: no assistant token after tokenization")
            continue
        sid = sample_id(ids, spec)
        if sid in seen:
            dupes += 1
            continue
        seen.add(sid)
        planned.append(Planned(sid, row.line, ids, mask))
    if not planned:
        raise ExtractError(f"{e.dataset}: no usable samples")
    if dupes:
        log(f"dropped {dupes} duplicate samples")
    return planned


def check_resume(e: ExtractConfig, planned: list[Planned], spec: CaptureSpec) -> dict | None:
    """The manifest of an earlier run into the same directory (None if new); refuses another spec
    and checks the disk budget for what is left to capture."""
    out = Path(e.output_dir)
    manifest = load_manifest(out)
    if manifest is not None and (diffs := spec.diff(manifest["capture"])):
        raise ExtractError(f"{out}: its shards were captured with {describe(diffs, 1)}, this run would capture with "
                           f"{describe(diffs, 0)}; use another extract.output_dir")
    bpt = bytes_per_token(spec.hidden_size, len(spec.layers.layer_ids), spec.dtype_bytes)
    shards = [planned[i : i + e.shard_size] for i in range(0, len(planned), e.shard_size)]
    done = {s["file"] for s in (manifest or {}).get("shards", [])}
    todo_tokens = sum(len(p.input_ids) for i, sh in enumerate(shards) if shard_name(i) not in done for p in sh)
    check_disk(out, todo_tokens, bpt)
    return manifest


def check_disk_before_regeneration(e: ExtractConfig, rows: list[Row], tokenizer, spec: CaptureSpec) -> None:
    """The disk check for a run that regenerates answers first, made before the server starts (and
    again after regeneration): each assistant turn counted at ``regenerate_max_new_tokens`` (plus a
    few template tokens), each sample at most ``max_length``."""
    template = read_chat_template(e.chat_template)
    lengths = []
    for row in rows:
        try:
            ids, mask = tokenize(row, tokenizer, template)
        except ValueError as err:
            raise ExtractError(f"{e.dataset}: line {row.line}: {err}") from err
        turns = sum(m["role"] == "assistant" for m in row.messages or [])
        lengths.append(min(e.max_length, len(ids) - sum(mask) * (turns > 0) + turns * (e.regenerate_max_new_tokens + 8)))
    bpt = bytes_per_token(spec.hidden_size, len(spec.layers.layer_ids), spec.dtype_bytes)
    check_disk(Path(e.output_dir), sum(lengths), bpt)

