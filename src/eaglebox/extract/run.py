"""An extraction run: data set -> verified capture requests -> shards, resumable by sample id.

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
   end: linear in the samples, :data:`~eaglebox.extract.commit.MANIFEST_SAVE_SHARE`).
   Feature bytes are written once and hashed once, by the server. The next shard's requests are
   already in flight meanwhile.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eaglebox import progress
from eaglebox.config.schema import ExtractConfig
from eaglebox.engine.launch import server_for
from eaglebox.extract.commit import (
    ManifestLedger,
    commit_shard,
    set_aside_damaged,
    staging_dir,
    wait_for_files,
)
from eaglebox.extract.dataset import Row
from eaglebox.extract.http import Client, capture_one
from eaglebox.extract.plan import (
    Planned,
    check_disk_before_regeneration,
    check_resume,
    plan_samples,
    select_rows,
)
from eaglebox.extract.throughput import Throughput, disk_write_rate
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.format import FORMAT, file_sha256, shard_dir, shard_name


@dataclass
class Plan:
    rows: list[Row]
    planned: list[Planned] | None  # None until regeneration has run
    manifest: dict | None


def prepare(e: ExtractConfig, spec: CaptureSpec, tokenizer, log=print) -> Plan:
    """Everything that can fail before a server starts: rows, tokenization, resume state, disk."""
    rows = select_rows(e, log)
    if e.regenerate:
        check_disk_before_regeneration(e, rows, tokenizer, spec)
        return Plan(rows, None, None)
    planned = plan_samples(e, rows, tokenizer, spec, log)
    return Plan(rows, planned, check_resume(e, planned, spec))


def capture(e: ExtractConfig, url: str, spec: CaptureSpec, tokenizer, plan: Plan, staging: Path, *,
            bound: float | None, alive=lambda: True, log=print, report: dict | None = None) -> dict:
    """Regenerate if asked, then capture every planned sample; returns the manifest."""
    if plan.planned is None:
        from eaglebox.extract.regenerate import regenerate

        client = Client(url, e.max_retries, e.retry_backoff_s, alive)
        rows = regenerate(e, plan.rows, client, tokenizer, Path(e.output_dir), log)
        planned = plan_samples(e, rows, tokenizer, spec, log)
        plan = Plan(rows, planned, check_resume(e, planned, spec))
    return run_extract(e, url, spec, plan.planned, plan.manifest, staging, bound=bound, alive=alive, log=log,
                       report=report)


def open_output(e: ExtractConfig, spec: CaptureSpec, manifest: dict | None, staging: Path) -> dict:
    """Make the output and staging folders, drop the files of writers killed mid-file (their samples are
    captured again) and return the manifest to extend (a new one when ``manifest`` is None)."""
    Path(e.output_dir).mkdir(parents=True, exist_ok=True)
    staging.mkdir(parents=True, exist_ok=True)
    for tmp in staging.glob(".*.tmp"):  # a writer killed mid-file; its sample is captured again
        tmp.unlink()
    manifest = manifest or {"format": FORMAT, "capture": spec.as_json(), "shards": []}
    manifest["dataset"] = {"path": str(e.dataset), "sha256": file_sha256(Path(e.dataset))}
    return manifest


def run_extract(e: ExtractConfig, url: str, spec: CaptureSpec, planned: list[Planned], manifest: dict | None,
                staging: Path, *, bound: float | None, alive=lambda: True, log=print, report: dict | None = None) -> dict:
    """Capture every planned sample into ``extract.output_dir``; returns the final manifest.

    ``staging`` is the server's capture directory (``EAGLEBOX_CAPTURE_DIR``), on the same filesystem.
    The progress bar shows the capture's GB/s beside the disk's raw rate; the last line logged (and
    ``report``, when given, filled) says what bound it (:func:`~eaglebox.extract.throughput.capture_bound`).
    ``bound`` is the largest |feature| a sample may hold (:func:`~eaglebox.extract.commit.feature_bound`).
    """
    out = Path(e.output_dir)
    shards = [planned[i : i + e.shard_size] for i in range(0, len(planned), e.shard_size)]
    done = {s["file"]: s for s in (manifest or {}).get("shards", [])}
    manifest = open_output(e, spec, manifest, staging)
    for name in set_aside_damaged(out, manifest, e.concurrency, log):
        manifest["shards"] = [s for s in manifest["shards"] if s["file"] != name]
        del done[name]
    client = Client(url, e.max_retries, e.retry_backoff_s, alive)
    bar = progress.bar(total=sum(len(p.input_ids) for p in planned), unit="tok", unit_scale=True, desc="extract",
               initial=sum(len(p.input_ids) for i, sh in enumerate(shards) if shard_name(i) in done for p in sh))
    to_capture = any(shard_name(i) not in done for i in range(len(shards)))
    speed = Throughput(disk_write_rate(staging) if to_capture else None,
                       (len(spec.layers.layer_ids) + 1) * spec.hidden_size * spec.dtype_bytes)
    ledger = ManifestLedger(out, manifest)

    def finish(index: int, shard: list[Planned], requests: list, present: int) -> None:
        """Wait for a shard's answers and files, then verify, move in and commit it."""
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
        ledger.record(commit_shard(out, index, shard, staging, spec, bound))
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
        if ledger.unsaved or not manifest["shards"]:
            ledger.save()
    except BaseException:
        ledger.save_after_error()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    log(speed.line())
    if report is not None:
        report.update(speed.report())
    return manifest


def capture_server(cfg, spec: CaptureSpec, log_path: Path):
    """An (unstarted) capture server for ``spec``'s layers, writing to :func:`staging_dir` samples that
    record ``spec`` (:meth:`CaptureSpec.sample_header`)."""
    return server_for(cfg, "capture", log_path, capture_dir=staging_dir(cfg.extract),
                      layer_ids=list(spec.layers.layer_ids),
                      sample_header=spec.sample_header())
