"""Server-side sink: assemble each request's prefill rows (all chunks) and write them off the hot path.

Runs inside SGLang's scheduler process but imports nothing from SGLang, so it is unit-tested alone.

- **Ownership.** ``add_chunk`` returns only once the sink holds rows that nobody else will write:
  host tensors are kept by reference (SGLang's ``copy_to_cpu`` allocates them fresh for each batch),
  device tensors are copied to pinned host memory and the copy is waited for before returning. The
  caller guarantees the rows are complete when it calls (SGLang synchronises ``copy_done`` or runs
  the forward on the same stream); after ``add_chunk`` returns, the producer may overwrite or free
  them at once (CUDA-graph static buffers, the overlap scheduler's next forward).
- **Keys.** Pending rows are keyed by request id, never by sample id: a retried or duplicated request
  for one sample is its own entry, and the one finishing last renames its file over the other's.
  A request that disappears without finishing (aborted) is forgotten when SGLang drops its ``Req``.
- **Memory.** Completed samples wait for the writers in a queue bounded in bytes: ``add_chunk`` waits
  while the rows the sink holds exceed ``buffer_bytes`` and there is something to wait for.
- **Writers.** ``writers`` threads hash, write and fsync samples in parallel: sha256 and file
  writes release the GIL. ``nice_writers`` (set when SGLang runs the forward on the CPU) lowers them
  to nice 19, so that they use idle time instead of preempting the forward's OpenMP threads. On the H200 host, 4 writers kept up with the disk (1.02x its raw
  fsync'd rate, worst round 0.96x) where 2 reached 0.71x (``benchmarks/capture_gpu.py``).

One file per sample, ``<dir>/<sample_id>.safetensors``, appears atomically (temp + rename):
``input_ids`` [L] int64 (the ids the server actually ran), ``aux`` [L, k*H] and ``last`` [L, H] in
the model's dtype, and metadata with the rows, a sha256 over the tensor bytes and each layer's
largest |value| (for the client's feature-health check).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglebox.shards.format import tensor_sha256, write_safetensors


@dataclass
class _Pending:
    sample_id: str
    input_ids: list[int]
    aux: list[torch.Tensor] = field(default_factory=list)
    last: list[torch.Tensor] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0


class CaptureSink:
    def __init__(self, out_dir: str | Path, *, buffer_bytes: int = 4 << 30, writers: int = 4,
                 nice_writers: bool = False, header: dict | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.header = header or {}
        self.buffer_bytes = buffer_bytes
        self._pending: dict[str, _Pending] = {}
        self._gone: list[str] = []  # rids whose Req was collected; forgotten on the next call
        self._queue: queue.Queue = queue.Queue()
        self._held = 0  # bytes of pending and queued rows
        self._queued = 0  # samples queued or being written
        self._cond = threading.Condition()
        self._errors: list[BaseException] = []
        self.stats = {"samples": 0, "bytes": 0, "hash_s": 0.0, "write_s": 0.0, "add_s": 0.0, "budget_wait_s": 0.0}
        self._t0 = time.monotonic()
        self._nice_writers = nice_writers
        for i in range(writers):
            threading.Thread(target=self._write_loop, name=f"eaglebox-capture-writer-{i}", daemon=True).start()

    @property
    def held_bytes(self) -> int:
        return self._held

    def add_chunk(self, rid: str, sample_id: str, input_ids: list[int], aux: torch.Tensor, last: torch.Tensor,
                  owner: object | None = None) -> dict | None:
        """Record one prefill chunk of request ``rid``; returns the response metadata once the request's
        rows are complete, else None. ``owner`` (SGLang's ``Req``): when it is garbage-collected before
        the rows are complete, they are freed. Raises if rows arrive beyond the prompt length."""
        self._raise_writer_error()
        self._forget_gone()
        t0 = time.perf_counter()
        n = aux.shape[0]
        if last.shape[0] != n:
            raise RuntimeError(f"capture {rid}: aux has {n} rows but last has {last.shape[0]}")
        p = self._pending.get(rid)
        if p is None:
            p = self._pending[rid] = _Pending(sample_id, list(input_ids))
            if owner is not None:
                weakref.finalize(owner, self._gone.append, rid)
        if p.rows + n > len(p.input_ids):
            self.drop(rid)
            raise RuntimeError(f"capture {rid}: {p.rows + n} rows for a {len(p.input_ids)}-token prompt")
        for dst, rows in ((p.aux, aux), (p.last, last)):
            dst.append(_host_rows(rows))
            p.nbytes += rows.numel() * rows.element_size()
            self._add_held(rows.numel() * rows.element_size())
        p.rows += n
        if p.rows < len(p.input_ids):
            self.stats["add_s"] += time.perf_counter() - t0
            return None
        del self._pending[rid]
        path = self.out_dir / f"{sample_id}.safetensors"
        with self._cond:
            self._queued += 1
        self._queue.put((path, p))
        t1 = time.perf_counter()
        self._wait_for_budget()
        self.stats["add_s"] += t1 - t0
        self.stats["budget_wait_s"] += time.perf_counter() - t1
        return {"file": str(path), "rows": p.rows, "dtype": str(aux.dtype).removeprefix("torch."),
                "aux_shape": [p.rows, aux.shape[1]], "last_shape": [p.rows, last.shape[1]], **self.header}

    def drop(self, rid: str) -> None:
        """Forget a request that was aborted or retracted (its rows will be recomputed)."""
        p = self._pending.pop(rid, None)
        if p is not None:
            self._add_held(-p.nbytes)

    def flush(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._queued == 0)
        self._raise_writer_error()

    def _forget_gone(self) -> None:
        while self._gone:
            self.drop(self._gone.pop())

    def _add_held(self, n: int) -> None:
        with self._cond:
            self._held += n
            self._cond.notify_all()

    def _wait_for_budget(self) -> None:
        """Block the scheduler while the sink holds more than its budget and a writer can free some."""
        with self._cond:
            self._cond.wait_for(lambda: self._held <= self.buffer_bytes or self._queued == 0 or self._errors)

    def _raise_writer_error(self) -> None:
        if self._errors:
            raise RuntimeError(f"eaglebox capture writer failed: {self._errors[0]!r}")

    def _write_loop(self) -> None:
        if self._nice_writers:
            _lowest_cpu_priority()
        while True:
            path, p = self._queue.get()
            try:
                _, hash_s, write_s = write_sample(path, p.input_ids, p.aux, p.last, self.header)
            except BaseException as err:  # surfaced on the next add_chunk / flush
                self._errors.append(err)
                hash_s = write_s = 0.0
            finally:
                with self._cond:
                    self._held -= p.nbytes
                    self._queued -= 1
                    self._count(p.nbytes, hash_s, write_s)
                    self._cond.notify_all()

    def _count(self, nbytes: int, hash_s: float, write_s: float) -> None:
        """Running totals (under the lock); every 256 samples one stderr line says where time goes, so a
        capture that falls behind the disk can be read off the server log."""
        st = self.stats
        st["samples"] += 1
        st["bytes"] += nbytes
        st["hash_s"] += hash_s
        st["write_s"] += write_s
        if st["samples"] % 256 == 0:
            wall = time.monotonic() - self._t0
            print(f"[eaglebox] capture: {st['samples']} samples, {st['bytes'] / 1e9:.1f} GB in {wall:.0f} s; writers "
                  f"hashed {st['hash_s']:.1f} s, wrote+fsynced {st['write_s']:.1f} s; scheduler spent "
                  f"{st['add_s']:.1f} s in add_chunk, {st['budget_wait_s']:.1f} s waiting for the byte budget",
                  file=sys.stderr, flush=True)


def _lowest_cpu_priority() -> None:
    """Nice this thread to 19 (Linux: a thread is a task): with few cores, the writer's copies and
    hashing then use idle time instead of preempting the forward pass's OpenMP threads, which all
    wait for the slowest one. The byte budget still makes the scheduler wait if they fall behind."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def write_sample(path: Path, input_ids: list[int], aux: list[torch.Tensor], last: list[torch.Tensor],
                 header: dict) -> tuple[str, float, float]:
    """Write one sample's chunks as its final, fsync'd file (the client verifies it and renames it
    into a shard: these are the only writes of its bytes, and this the only hash); returns the
    tensor sha256 it records and the seconds spent hashing and writing."""
    tensors = {"input_ids": [torch.tensor(input_ids, dtype=torch.int64)], "aux": aux, "last": last}
    t0 = time.perf_counter()
    digest = tensor_sha256(tensors)
    t1 = time.perf_counter()
    meta = {"rows": str(len(input_ids)), "sha256": digest, "header": json.dumps(header, sort_keys=True),
            "max_abs": json.dumps(max_abs(aux, aux[0].shape[1] // last[0].shape[1]) + max_abs(last, 1))}
    write_safetensors(path, tensors, meta, fsync=True, file_digest=False)
    return digest, t1 - t0, time.perf_counter() - t1


def max_abs(parts: list[torch.Tensor], layers: int) -> list[float]:
    """The largest |value| of each of ``layers`` equal column blocks over the rows of ``parts``; nan or
    inf when one is: the client's feature-health check reads it (``extract/client.py``)."""
    per_part = [p.reshape(p.shape[0], layers, -1).abs().amax(dim=(0, 2)).float() for p in parts if p.shape[0]]
    return torch.stack(per_part).amax(0).tolist()


def _host_rows(t: torch.Tensor) -> torch.Tensor:
    """Rows the sink owns. Host rows are kept as they are; device rows are copied into pinned memory
    on the current stream, and the copy is waited for: once this returns, the device memory may be
    overwritten (a CUDA-graph buffer's next replay) or freed without touching what the sink holds."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host
