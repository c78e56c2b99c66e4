"""Server-side sink: assemble each request's prefill rows (all chunks) and write them off the hot path.

Runs inside SGLang's scheduler process but imports nothing from SGLang, so it is unit-tested alone.
The scheduler thread only keeps references to row slices (on GPU it also starts an asynchronous
copy to pinned memory); a writer thread does the device-to-host copy, the hashing and the file
write. A bounded queue makes the scheduler wait rather than grow memory when the disk is slow.

One file per sample, ``<dir>/<sample_id>.safetensors``, appears atomically (temp + rename):
``input_ids`` [L] int64 (the ids the server actually ran), ``aux`` [L, k*H] and ``last`` [L, H] in
the model's dtype, and metadata with the rows and a sha256 over the tensor bytes.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglebox.shards.format import tensor_sha256, write_safetensors

RID_PREFIX = "eaglebox-"


def sample_id_from_rid(rid: str) -> str | None:
    """``eaglebox-<sample_id>-<nonce>`` -> ``<sample_id>``; None for requests that are not captures."""
    if not isinstance(rid, str) or not rid.startswith(RID_PREFIX):
        return None
    body = rid[len(RID_PREFIX):]
    sid, _, nonce = body.rpartition("-")
    return sid if sid and nonce else None


@dataclass
class _Pending:
    input_ids: list[int]
    aux: list[torch.Tensor] = field(default_factory=list)
    last: list[torch.Tensor] = field(default_factory=list)
    rows: int = 0


class CaptureSink:
    def __init__(self, out_dir: str | Path, *, queue_size: int = 8, header: dict | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.header = header or {}
        self._pending: dict[str, _Pending] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._write_loop, name="eaglebox-capture-writer", daemon=True)
        self._thread.start()

    def add_chunk(self, sample_id: str, input_ids: list[int], aux: torch.Tensor, last: torch.Tensor) -> dict | None:
        """Record one prefill chunk of a request; returns the response metadata once the request's
        rows are complete, else None. Raises if rows arrive beyond the prompt length."""
        if self._errors:
            raise RuntimeError(f"eaglebox capture writer failed: {self._errors[0]!r}")
        p = self._pending.setdefault(sample_id, _Pending(input_ids=list(input_ids)))
        n = aux.shape[0]
        if last.shape[0] != n:
            raise RuntimeError(f"capture {sample_id}: aux has {n} rows but last has {last.shape[0]}")
        if p.rows + n > len(p.input_ids):
            self._pending.pop(sample_id, None)
            raise RuntimeError(f"capture {sample_id}: {p.rows + n} rows for a {len(p.input_ids)}-token prompt")
        p.aux.append(_start_copy(aux))
        p.last.append(_start_copy(last))
        p.rows += n
        if p.rows < len(p.input_ids):
            return None
        del self._pending[sample_id]
        path = self.out_dir / f"{sample_id}.safetensors"
        self._queue.put((path, p))
        return {"file": str(path), "rows": p.rows, "dtype": str(aux.dtype).removeprefix("torch."),
                "aux_shape": [p.rows, aux.shape[1]], "last_shape": [p.rows, last.shape[1]], **self.header}

    def drop(self, sample_id: str) -> None:
        """Forget a request that was aborted or retracted (its rows will be recomputed)."""
        self._pending.pop(sample_id, None)

    def flush(self) -> None:
        self._queue.join()
        if self._errors:
            raise RuntimeError(f"eaglebox capture writer failed: {self._errors[0]!r}")

    def _write_loop(self) -> None:
        _lowest_cpu_priority()
        while True:
            path, p = self._queue.get()
            try:
                write_sample(path, p.input_ids, [_finish_copy(t) for t in p.aux], [_finish_copy(t) for t in p.last],
                             self.header)
            except BaseException as err:  # surfaced on the next add_chunk / flush
                self._errors.append(err)
            finally:
                self._queue.task_done()


def _lowest_cpu_priority() -> None:
    """Nice this thread to 19 (Linux: a thread is a task): with few cores, the writer's copies and
    hashing then use idle time instead of preempting the forward pass's OpenMP threads, which all
    wait for the slowest one. The bounded queue still makes the scheduler wait if it falls behind."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def write_sample(path: Path, input_ids: list[int], aux: list[torch.Tensor], last: list[torch.Tensor],
                 header: dict) -> str:
    """Write one sample's chunks as a staged safetensors file (no fsync: the client packs it into a
    shard and deletes it); returns the tensor sha256 it records."""
    tensors = {"input_ids": [torch.tensor(input_ids, dtype=torch.int64)], "aux": aux, "last": last}
    digest = tensor_sha256(tensors)
    meta = {"rows": str(len(input_ids)), "sha256": digest, "header": json.dumps(header, sort_keys=True)}
    write_safetensors(path, tensors, meta, fsync=False)
    return digest


def _start_copy(t: torch.Tensor):
    """On GPU, start a non-blocking copy into pinned memory now (the buffer may be reused later);
    on CPU, keep a reference (the logits output is a fresh tensor each forward)."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return (host, event)


def _finish_copy(item) -> torch.Tensor:
    if isinstance(item, tuple):
        host, event = item
        event.synchronize()
        return host
    return item
