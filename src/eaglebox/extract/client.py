"""The extraction client: data set -> verified capture requests -> shards, resumable by sample id.

Order of work, and why:

1. Read and tokenize the whole data set first. Bad rows fail (or are skipped) before anything is
   written, and the token count gives the disk estimate, which is checked against free space.
2. Plan: unique samples in data-set order, ``shard_size`` to a shard. The plan depends only on the
   data and the capture spec, so an interrupted run resumes into the same shards, byte for byte.
3. For each shard not yet in the manifest: capture the samples the staging folder lacks (the server
   writes and fsyncs ``.staging/<sample_id>.safetensors``, hashing it as it writes), verify every
   sample (rows == prompt tokens, echoed ids == sent ids, the capture header, widths and dtype),
   rename it into the shard's folder, write the shard's small index and commit it in the manifest
   (rewritten once the samples committed since its last write are 1/8 of all it records, and at the
   end: linear in the samples, :data:`MANIFEST_SAVE_SHARE`).
   Feature bytes are written once and hashed once, by the server. The next shard's requests are
   already in flight meanwhile.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
import torch

from eaglebox import progress
from eaglebox.errors import EagleboxError
from eaglebox.extract.dataset import BadRow, Row, read_chat_template, read_rows, tokenize
from eaglebox.shards.capture import CaptureSpec, describe
from eaglebox.shards.format import (
    DAMAGED,
    DTYPE_CODES,
    FORMAT,
    MANIFEST,
    DamagedSample,
    ShardError,
    check_index,
    file_sha256,
    fsync_dir,
    load_manifest,
    open_safetensors,
    read_sample,
    save_manifest,
    shard_dir,
    shard_name,
    write_index,
)
from eaglebox.shards.requests import capture_rid
from eaglebox.target.weights import load_embedding

STAGING = ".staging"
MANIFEST_SAVE_SHARE = 8
"""The manifest (every sample's entry) is rewritten after a shard once the samples committed since its
last write are at least 1/8 of all it records, and at the end (or on an error): the bytes written stay
under ~9x the final manifest, where rewriting it after every shard is quadratic in the samples (at 20k
samples, 256 a shard: 79 rewrites of up to 6 MB, ~1 s of JSON encoding each). A shard committed but
not yet recorded when the client is killed is committed again by the next run from its shard folder
(its samples are not captured again; see ``commit_shard``)."""


class ExtractError(EagleboxError):
    pass


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


class Client:
    """HTTP calls to the capture server, with bounded retries and backoff."""

    def __init__(self, url: str, max_retries: int, backoff_s: float, alive=lambda: True):
        self.url, self.max_retries, self.backoff_s, self.alive = url, max_retries, backoff_s, alive
        self.session = threading.local()

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        sess = getattr(self.session, "s", None) or requests.Session()
        self.session.s = sess
        last = None
        for attempt in range(self.max_retries + 1):
            if not self.alive():
                raise ExtractError(f"the SGLang server at {self.url} has exited")
            try:
                r = sess.post(self.url + path, json=body, timeout=timeout)
                if r.status_code < 500:
                    if r.status_code != 200:
                        raise ExtractError(f"{path}: HTTP {r.status_code}: {r.text[:500]}")
                    return r.json()
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except requests.RequestException as err:
                last = f"{type(err).__name__}: {err}"
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise ExtractError(f"{self.url}{path} failed after {self.max_retries + 1} tries; last error: {last}")


def select_rows(cfg, log=print) -> list[Row]:
    """Parse the data set; bad rows fail the run or are skipped (``extract.on_bad_row``)."""
    e = cfg.extract
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


def plan_samples(cfg, rows: list[Row], tokenizer, spec: CaptureSpec, log=print) -> list[Planned]:
    """Tokenize (assistant-only loss mask), drop over-long rows and duplicates, in data-set order."""
    e = cfg.extract
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


def check_resume(cfg, planned: list[Planned], spec: CaptureSpec) -> dict | None:
    """The manifest of an earlier run into the same directory (None if new); refuses another spec
    and checks the disk budget for what is left to capture."""
    e = cfg.extract
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


def check_disk_before_regeneration(cfg, rows: list[Row], tokenizer, spec: CaptureSpec) -> None:
    """The disk check for a run that regenerates answers first, made before the server starts (and
    again after regeneration): each assistant turn counted at ``regenerate_max_new_tokens`` (plus a
    few template tokens), each sample at most ``max_length``."""
    e = cfg.extract
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


@dataclass
class Plan:
    rows: list[Row]
    planned: list[Planned] | None  # None until regeneration has run
    manifest: dict | None


def prepare(cfg, spec: CaptureSpec, tokenizer, log=print) -> Plan:
    """Everything that can fail before a server starts: rows, tokenization, resume state, disk."""
    rows = select_rows(cfg, log)
    if cfg.extract.regenerate:
        check_disk_before_regeneration(cfg, rows, tokenizer, spec)
        return Plan(rows, None, None)
    planned = plan_samples(cfg, rows, tokenizer, spec, log)
    return Plan(rows, planned, check_resume(cfg, planned, spec))


def capture(cfg, url: str, spec: CaptureSpec, tokenizer, plan: Plan, staging: Path, *, alive=lambda: True,
            log=print, report: dict | None = None) -> dict:
    """Regenerate if asked, then capture every planned sample; returns the manifest."""
    if plan.planned is None:
        from eaglebox.extract.regenerate import regenerate

        client = Client(url, cfg.extract.max_retries, cfg.extract.retry_backoff_s, alive)
        rows = regenerate(cfg, plan.rows, client, tokenizer, Path(cfg.extract.output_dir), log)
        planned = plan_samples(cfg, rows, tokenizer, spec, log)
        plan = Plan(rows, planned, check_resume(cfg, planned, spec))
    return run_extract(cfg, url, spec, plan.planned, plan.manifest, staging, alive=alive, log=log, report=report)


DISK_PROBE_BYTES = 128 << 20


def disk_write_rate(folder: Path, nbytes: int = DISK_PROBE_BYTES) -> float | None:
    """The disk's raw rate at ``folder``: bytes/s of a sequential, fsync'd write of ``nbytes`` (at most an
    eighth of the free space), removed after; None when it cannot be measured (a disk that is full)."""
    path = folder / f".disk-rate-{os.getpid()}.tmp"
    try:
        nbytes = min(nbytes, shutil.disk_usage(folder).free // 8)
        if nbytes < 1 << 20:
            return None
        block = os.urandom(min(nbytes, 16 << 20))
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(nbytes // len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return nbytes // len(block) * len(block) / (time.perf_counter() - t0)
    except OSError:
        return None
    finally:
        path.unlink(missing_ok=True)


WAITED_FOR_WRITERS = 0.1
"""Capture is bound by its writers (or the disk under them) once it spent this share of its time
waiting for them: the scheduler at the byte budget, or the client for files whose answers were back."""
DISK_BOUND = 0.8
"""... and by the disk when it wrote at this share of the disk's raw rate or more."""


def capture_bound(wall_s: float, nbytes: int, disk_bps: float | None, budget_wait_s: float,
                  files_wait_s: float) -> str:
    """What set the pace of a capture: ``prefill`` (the writers kept up: the server's forward did),
    ``disk`` (it waited for writers that wrote at the disk's rate) or ``writers`` (it waited for
    writers that did not reach the disk's rate: hashing, copying, CPU)."""
    if (budget_wait_s + files_wait_s) < WAITED_FOR_WRITERS * wall_s:
        return "prefill"
    if disk_bps is not None and nbytes / wall_s >= DISK_BOUND * disk_bps:
        return "disk"
    return "writers"


@dataclass
class Throughput:
    """Capture speed for the progress bar and the run report: feature bytes this run captured and
    committed, against the disk's raw rate; the sink's own numbers come with each answer."""
    disk_bps: float | None
    feature_bytes_per_token: int
    t0: float = field(default_factory=time.monotonic)
    bytes: int = 0
    files_wait_s: float = 0.0
    server: dict = field(default_factory=dict)

    def add(self, tokens: int, sink_stats: dict | None) -> None:
        self.bytes += tokens * self.feature_bytes_per_token
        if sink_stats and sink_stats.get("samples", 0) >= self.server.get("samples", 0):
            self.server = sink_stats

    def rate(self) -> float:
        return self.bytes / max(time.monotonic() - self.t0, 1e-9)

    def postfix(self) -> str:
        disk = f"{self.disk_bps / 1e9:.2f} GB/s" if self.disk_bps else "unknown"
        return f"capture {self.rate() / 1e9:.2f} GB/s, disk {disk}"

    def report(self) -> dict:
        wall = time.monotonic() - self.t0
        budget_wait = self.server.get("budget_wait_s", 0.0)
        out = {"bytes": self.bytes, "seconds": round(wall, 2), "capture_gb_s": round(self.bytes / wall / 1e9, 3),
               "disk_gb_s": round(self.disk_bps / 1e9, 3) if self.disk_bps else None,
               "bound_by": capture_bound(wall, self.bytes, self.disk_bps, budget_wait, self.files_wait_s) if self.bytes
               else None, "client_waited_for_files_s": round(self.files_wait_s, 2)}
        out.update({f"server_{k}": round(v, 2) if isinstance(v, float) else v for k, v in self.server.items()})
        return out

    def line(self) -> str:
        r = self.report()
        if not self.bytes:
            return "extract: nothing captured in this run"
        return (f"extract: captured {r['bytes'] / 1e9:.2f} GB in {r['seconds']:.1f} s, {self.postfix()} (raw, fsync'd): "
                f"bound by {r['bound_by']} (the server waited {r.get('server_budget_wait_s', 0):.1f} s for its writers' "
                f"byte budget, the client {r['client_waited_for_files_s']:.1f} s for files; the writers hashed "
                f"{r.get('server_hash_s', 0):.1f} s and wrote {r.get('server_write_s', 0):.1f} s)")


def run_extract(cfg, url: str, spec: CaptureSpec, planned: list[Planned], manifest: dict | None, staging: Path, *,
                alive=lambda: True, log=print, report: dict | None = None) -> dict:
    """Capture every planned sample into ``extract.output_dir``; returns the final manifest.

    ``staging`` is the server's capture directory (``EAGLEBOX_CAPTURE_DIR``), on the same filesystem.
    The progress bar shows the capture's GB/s beside the disk's raw rate; the last line logged (and
    ``report``, when given, filled) says what bound it (:func:`capture_bound`).
    """
    e = cfg.extract
    out = Path(e.output_dir)
    shards = [planned[i : i + e.shard_size] for i in range(0, len(planned), e.shard_size)]
    done = {s["file"]: s for s in (manifest or {}).get("shards", [])}
    out.mkdir(parents=True, exist_ok=True)
    staging.mkdir(parents=True, exist_ok=True)
    for tmp in staging.glob(".*.tmp"):  # a writer killed mid-file; its sample is captured again
        tmp.unlink()
    manifest = manifest or {"format": FORMAT, "capture": spec.as_json(), "shards": []}
    manifest["dataset"] = {"path": str(e.dataset), "sha256": file_sha256(Path(e.dataset))}
    bound = feature_bound(cfg.model.path)
    for name in set_aside_damaged(out, manifest, e.concurrency, log):
        manifest["shards"] = [s for s in manifest["shards"] if s["file"] != name]
        del done[name]
    client = Client(url, e.max_retries, e.retry_backoff_s, alive)
    bar = progress.bar(total=sum(len(p.input_ids) for p in planned), unit="tok", unit_scale=True, desc="extract",
               initial=sum(len(p.input_ids) for i, sh in enumerate(shards) if shard_name(i) in done for p in sh))
    to_capture = any(shard_name(i) not in done for i in range(len(shards)))
    speed = Throughput(disk_write_rate(staging) if to_capture else None,
                       (len(spec.layers.layer_ids) + 1) * spec.hidden_size * spec.dtype_bytes)

    manifest["samples"] = sum(len(s["samples"]) for s in manifest["shards"])
    manifest["tokens"] = sum(r["rows"] for s in manifest["shards"] for r in s["samples"])
    unsaved = 0  # samples committed since the manifest was last written

    def save() -> None:
        nonlocal unsaved
        save_manifest(out, manifest)
        unsaved = 0

    def finish(index: int, shard: list[Planned], requests: list, present: int) -> None:
        """Wait for a shard's answers and files, then verify, move in and commit it."""
        nonlocal unsaved
        answers = [f.result() for f in requests]
        requested = [p for p, _ in answers]
        bar.update(sum(len(p.input_ids) for p in requested))
        t0 = time.monotonic()
        wait_for_files([(staging / f"{p.id}.safetensors", f"sample at line {p.line}") for p in requested],
                       alive=alive)
        speed.files_wait_s += time.monotonic() - t0
        for p, sink_stats in answers:
            speed.add(len(p.input_ids), sink_stats)
        bar.set_postfix_str(speed.postfix(), refresh=False)
        entry = commit_shard(out, index, shard, staging, spec, bound)
        bisect.insort(manifest["shards"], entry, key=lambda s: s["file"])
        manifest["samples"] += len(entry["samples"])
        manifest["tokens"] += sum(r["rows"] for r in entry["samples"])
        unsaved += len(entry["samples"])
        if unsaved * MANIFEST_SAVE_SHARE >= manifest["samples"]:
            save()
        if present:
            log(f"{shard_name(index)}: reused {present} staged samples")

    # Shard k+1's requests are queued before shard k is packed, so the server never idles while the
    # client waits for the last files, verifies and writes a shard.
    pool = ThreadPoolExecutor(e.concurrency)
    try:
        previous = None
        for index, shard in enumerate(shards):
            if shard_name(index) in done:
                continue
            missing = [p for p in shard if not (staging / f"{p.id}.safetensors").exists()
                       and not (out / shard_dir(index) / f"{p.id}.safetensors").exists()]
            present = len(shard) - len(missing)
            sent = {p.id for p in missing}
            bar.update(sum(len(p.input_ids) for p in shard if p.id not in sent))
            current = (index, shard, [pool.submit(capture_one, client, p) for p in missing], present)
            if previous:
                finish(*previous)
            previous = current
        if previous:
            finish(*previous)
        if unsaved or not manifest["shards"]:
            save()
    except BaseException:
        if unsaved:  # what was committed is recorded (a rerun would commit it again, from its shard folder)
            try:
                save()
            except OSError:
                pass  # the disk that failed; the manifest on disk is the last whole one
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    log(speed.line())
    if report is not None:
        report.update(speed.report())
    return manifest


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


def capture_one(client: Client, p: Planned) -> tuple[Planned, dict | None]:
    """Send one sample and check the server's answer; its file is written by the server's writer
    process and appears (atomically) a little later. Returns the sample and the sink's numbers."""
    rid = capture_rid(p.id)
    body = {"input_ids": p.input_ids, "rid": rid, "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    out = client.post("/generate", body)
    meta = out.get("meta_info", {})
    hs = meta.get("hidden_states") or []
    if meta.get("prompt_tokens") != len(p.input_ids):
        raise ExtractError(f"sample at line {p.line}: server saw {meta.get('prompt_tokens')} prompt tokens, "
                           f"sent {len(p.input_ids)}")
    if len(hs) != 1 or not isinstance(hs[0], dict) or hs[0].get("rows") != len(p.input_ids):
        raise ExtractError(f"sample at line {p.line}: the server's capture answer {str(hs)[:300]} does not "
                           f"cover {len(p.input_ids)} rows (is the eaglebox hook active, radix cache off?)")
    return p, hs[0].get("sink")


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


def verify_staged(path: Path, p: Planned, spec: CaptureSpec, bound: float | None = None) -> str:
    """Check one staged sample against what was sent, from its header and token ids (no feature bytes
    read), and its features' health from the largest values the server recorded (:func:`check_health`);
    returns the tensor sha256 the server computed as it wrote the file."""
    with open_safetensors(path, ExtractError) as f:
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
    cause = (f"likely cause: the engine computes this target wrongly with attention backend "
             f"{opts.attention_backend or 'SGLang default'} in {opts.dtype}"
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
        digest = verify_staged(src, p, spec, bound)
        if src != final:
            os.replace(src, final)
        entries.append({"id": p.id, "line": p.line, "file": f"{folder.name}/{final.name}", "offset": offset,
                        "rows": len(p.input_ids), "loss_tokens": int(sum(p.loss_mask)), "sha256": digest})
        offset += len(p.input_ids)
    fsync_dir(folder)
    path = out / shard_name(index)
    digest, size = write_index(path, [p.input_ids for p in shard], [p.loss_mask for p in shard],
                               [p.id for p in shard], spec)
    return {"file": path.name, "sha256": digest, "bytes": size, "samples": entries}
