"""Server-side sink: assemble each request's prefill rows (all chunks) and write them off the hot path.

Runs inside SGLang's scheduler process but imports nothing from SGLang, so it is unit-tested alone.

- **Writer process.** Hashing, writing and fsyncing happen in a child process
  (:mod:`eaglebox.capture.writer`), not in threads of the scheduler's interpreter: writer threads there
  share the scheduler's GIL, and each of their returns to Python waits for the scheduler thread, which
  runs Python without pause while it drives a GPU (H200: threads wrote at a third of the disk's rate
  inside SGLang). The scheduler copies each chunk's rows into shared memory (a ``memfd`` both processes
  map; the copy releases the GIL) and returns; the writer process maps the same pages and writes them.
  It is started by the sink's reader thread with ``PR_SET_PDEATHSIG``, so it dies with the scheduler
  (kill -9 included), and it exits by itself once the sink is closed or garbage-collected.
- **Ownership.** ``add_chunk`` returns only once the rows are in the sink's shared memory: host rows
  are copied there, device rows are copied there on the current stream and the copy is waited for. The
  caller guarantees the rows are complete when it calls (SGLang synchronises ``copy_done`` or runs the
  forward on the same stream); after ``add_chunk`` returns, the producer may overwrite or free them at
  once (CUDA-graph static buffers, the overlap scheduler's next forward).
- **Keys.** Pending rows are keyed by request id, never by sample id: a retried or duplicated request
  for one sample is its own entry, and the one finishing last renames its file over the other's.
  A request that disappears without finishing (aborted) is forgotten when SGLang drops its ``Req``.
- **Memory.** Each request gets its region of the shared memory (its prompt's ids and rows) at its first
  chunk; the region is reused once the sample is written. Completed samples wait for the writers in a
  queue bounded in bytes: ``add_chunk`` waits while the rows the sink holds exceed ``buffer_bytes`` and
  there is something to wait for. The shared file is sparse: only the pages regions have used take memory.
- **Writers.** ``writers`` threads of the writer process hash, write and fsync samples in parallel.
  ``nice_writers`` (set when SGLang runs the forward on the CPU) lowers the whole writer process to
  nice 19, so that it uses idle time instead of preempting the forward's OpenMP threads. A writer's
  failure (or the writer process's death) is raised by the next ``add_chunk`` or ``flush``, and the
  first is passed at once to ``on_error`` (the hook stops the server with it: there may be no next call).

One file per sample, ``<dir>/<sample_id>.safetensors``, appears atomically (temp + rename):
``input_ids`` [L] int64 (the ids the server actually ran), ``aux`` [L, k*H] and ``last`` [L, H] in
the model's dtype, and metadata with the rows, a sha256 over the tensor bytes and each layer's
largest |value| (for the client's feature-health check).
"""

from __future__ import annotations

import bisect
import ctypes
import json
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from eaglebox.config.schema import CAPTURE_WRITERS
from eaglebox.shards.format import safetensors_blobs, tensor_sha256, write_safetensors

SHARED_BYTES = 1 << 40
"""Size of the shared file: sparse (pages exist once a region is used), so only address space."""
ALIGN = 4096


@dataclass
class _Pending:
    sample_id: str
    rows_total: int
    offset: int  # of its region in the shared memory
    size: int
    layout: dict  # where the writer finds ids, aux and last (see _layout)
    aux: torch.Tensor  # views of the region
    last: torch.Tensor
    rows: int = 0
    nbytes: int = 0


def _layout(rows: int, aux: torch.Tensor, last: torch.Tensor) -> tuple[dict, int]:
    """ids [rows] int64, then aux [rows, k*H], then last [rows, H], each at a 64-byte boundary."""
    def up(n: int, to: int = 64) -> int:
        return -(-n // to) * to
    es = aux.element_size()
    aux_off = up(8 * rows)
    last_off = aux_off + up(rows * aux.shape[1] * es)
    size = up(last_off + rows * last.shape[1] * es, ALIGN)
    return {"rows": rows, "dtype": str(aux.dtype).removeprefix("torch."), "aux_width": aux.shape[1],
            "last_width": last.shape[1], "aux_offset": aux_off, "last_offset": last_off}, size


def region_views(base: torch.Tensor, offset: int, layout: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ids, aux and last tensors of a region of the shared memory (``base``: all of it, as uint8)."""
    rows, dtype = layout["rows"], getattr(torch, layout["dtype"])
    es = torch.empty(0, dtype=dtype).element_size()
    ids = base[offset : offset + 8 * rows].view(torch.int64)
    a, b = offset + layout["aux_offset"], offset + layout["last_offset"]
    aux = base[a : a + rows * layout["aux_width"] * es].view(dtype).view(rows, layout["aux_width"])
    last = base[b : b + rows * layout["last_width"] * es].view(dtype).view(rows, layout["last_width"])
    return ids, aux, last


class _Regions:
    """First-fit allocation of page-aligned regions of the shared memory, freed regions coalesced:
    lowest addresses first, so a steady capture reuses the same (already faulted-in) pages."""

    def __init__(self, size: int):
        self.free = [(0, size)]  # (offset, size), sorted by offset

    def take(self, n: int) -> int:
        for i, (off, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = (off + n, size - n)
                return off
        raise MemoryError(f"eaglebox capture: no {n:,}-byte region left in {SHARED_BYTES:,} bytes of shared memory")

    def give(self, off: int, n: int) -> None:
        i = bisect.bisect(self.free, (off, 0))
        if i < len(self.free) and off + n == self.free[i][0]:
            n += self.free.pop(i)[1]
        if i and self.free[i - 1][0] + self.free[i - 1][1] == off:
            off, n = self.free[i - 1][0], self.free[i - 1][1] + n
            i -= 1
            del self.free[i]
        self.free.insert(i, (off, n))


class _Writer:
    """The writer process, the shared memory, and the accounting the reader thread shares with the
    sink. Holds no reference to the sink: a sink nobody uses any more is collected, and its writer
    process finishes the samples it was sent and exits."""

    def __init__(self, writers: int, nice: bool, on_error=None, out_dir: Path = Path(".")):
        self.on_error = on_error
        self.cond = threading.Condition()
        self.regions = _Regions(SHARED_BYTES)
        self.jobs: dict[int, tuple[int, int]] = {}  # region offset -> (region size, bytes held) of queued samples
        self.held = 0  # bytes of pending and queued rows
        self.errors: list[str] = []
        self.stats = {"samples": 0, "bytes": 0, "hash_s": 0.0, "write_s": 0.0, "add_s": 0.0, "budget_wait_s": 0.0,
                      "writers": writers}
        self.t0 = time.monotonic()
        self.closing = False
        self.proc: subprocess.Popen | None = None
        fd = os.memfd_create("eaglebox-capture")
        ours, theirs = socket.socketpair()
        try:
            os.ftruncate(fd, SHARED_BYTES)
            self.mm = mmap.mmap(fd, SHARED_BYTES)
            self.base = torch.frombuffer(self.mm, dtype=torch.uint8)
            self.sock = ours  # shut down for writing to end the writer process (closing it would not wake recv)
            self.conn = Connection(os.dup(ours.fileno()))
            cmd = [sys.executable, "-m", "eaglebox.capture.writer", str(fd), str(theirs.fileno()), str(writers),
                   "1" if nice else "0", str(os.getpid()), str(out_dir)]
            started, failed = threading.Event(), []
            # The reader thread starts the process: PR_SET_PDEATHSIG follows the thread that forked it,
            # and this thread lives exactly as long as the writer process is needed.
            self.thread = threading.Thread(target=self._run, args=(cmd, (fd, theirs.fileno()), started, failed),
                                           name="eaglebox-capture-reader", daemon=True)
            self.thread.start()
            started.wait()
        finally:
            os.close(fd)
            theirs.close()
        if failed:
            raise failed[0]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, offset: int, size: int, nbytes: int, job: tuple) -> None:
        with self.cond:
            self.jobs[offset] = (size, nbytes)
        try:
            self.conn.send((offset, *job))
        except OSError as err:  # the writer process is gone; the reader thread says why
            self.thread.join(10)
            self._fail(f"the writer process is gone ({err!r})")

    def close(self) -> None:
        """No more samples: the writer process writes those it has and exits."""
        with self.cond:
            if self.closing:
                return
            self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:  # the writer process is gone
            pass

    def _run(self, cmd: list[str], fds: tuple[int, int], started: threading.Event, failed: list) -> None:
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL)
        except BaseException as err:
            failed.append(err)
            return
        finally:
            started.set()
        while True:
            try:
                offset, error, hash_s, write_s = self.conn.recv()
            except (EOFError, OSError):
                break
            with self.cond:
                size, nbytes = self.jobs.pop(offset)
                self.regions.give(offset, size)
                self.held -= nbytes
                self._count(nbytes, hash_s, write_s)
                self.cond.notify_all()
            if error is not None:
                self._fail(error)
        code = self.proc.wait()
        self.conn.close()
        self.sock.close()
        if self.jobs or not self.closing:
            self._fail(f"the writer process (pid {self.proc.pid}) exited with code {code}, {len(self.jobs)} samples "
                       "unwritten")

    def _fail(self, error: str) -> None:
        """Record a writer's failure for the next add_chunk or flush, and report the first one at once
        (``on_error``): the scheduler may have no next call to make, its last request answered."""
        with self.cond:
            self.errors.append(error)
            first = len(self.errors) == 1
            self.cond.notify_all()
        if first and self.on_error is not None:
            self.on_error(f"eaglebox capture writer failed: {error}")

    def _count(self, nbytes: int, hash_s: float, write_s: float) -> None:
        """Running totals (under the lock); every 256 samples one stderr line says where time goes, so a
        capture that falls behind the disk can be read off the server log."""
        st = self.stats
        st["samples"] += 1
        st["bytes"] += nbytes
        st["hash_s"] += hash_s
        st["write_s"] += write_s
        if st["samples"] % 256 == 0:
            wall = time.monotonic() - self.t0
            try:
                print(f"[eaglebox] capture: {st['samples']} samples, {st['bytes'] / 1e9:.1f} GB in {wall:.0f} s; "
                      f"writers hashed {st['hash_s']:.1f} s, wrote+fsynced {st['write_s']:.1f} s; scheduler spent "
                      f"{st['add_s']:.1f} s in add_chunk, {st['budget_wait_s']:.1f} s waiting for the byte budget",
                      file=sys.stderr, flush=True)
            except OSError:  # a full disk under the log: the samples still count
                pass


class CaptureSink:
    def __init__(self, out_dir: str | Path, *, buffer_bytes: int = 4 << 30, writers: int = CAPTURE_WRITERS,
                 nice_writers: bool = False, header: dict | None = None, on_error=None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.header = header or {}
        self.buffer_bytes = buffer_bytes
        self._pending: dict[str, _Pending] = {}
        self._gone: list[str] = []  # rids whose Req was collected; forgotten on the next call
        self._w = _Writer(writers, nice_writers, on_error, self.out_dir)
        self.stats = self._w.stats
        weakref.finalize(self, self._w.close)

    @property
    def held_bytes(self) -> int:
        return self._w.held

    @property
    def writer_pid(self) -> int:
        return self._w.pid

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
            p = self._pending[rid] = self._new_pending(sample_id, input_ids, aux, last)
            if owner is not None:
                weakref.finalize(owner, self._gone.append, rid)
        if p.rows + n > p.rows_total:
            self.drop(rid)
            raise RuntimeError(f"capture {rid}: {p.rows + n} rows for a {p.rows_total}-token prompt")
        if (aux.dtype, aux.shape[1:], last.dtype, last.shape[1:]) != (p.aux.dtype, p.aux.shape[1:], p.last.dtype,
                                                                       p.last.shape[1:]):
            self.drop(rid)
            raise RuntimeError(f"capture {rid}: a chunk of {aux.dtype} {list(aux.shape)} / {list(last.shape)} after "
                               f"{p.aux.dtype} {list(p.aux.shape)} / {list(p.last.shape)}")
        for dst, rows in ((p.aux, aux), (p.last, last)):
            _copy_rows(dst[p.rows : p.rows + n], rows)
            p.nbytes += rows.numel() * rows.element_size()
            self._add_held(rows.numel() * rows.element_size())
        p.rows += n
        if p.rows < p.rows_total:
            self.stats["add_s"] += time.perf_counter() - t0
            return None
        del self._pending[rid]
        path = self.out_dir / f"{sample_id}.safetensors"
        self._w.send(p.offset, p.size, p.nbytes, (sample_id, p.layout, self.header))
        self._raise_writer_error()
        t1 = time.perf_counter()
        self._wait_for_budget()
        self.stats["add_s"] += t1 - t0
        self.stats["budget_wait_s"] += time.perf_counter() - t1
        with self._w.cond:
            stats = dict(self.stats)
        return {"file": str(path), "rows": p.rows, "dtype": p.layout["dtype"], "aux_shape": [p.rows, aux.shape[1]],
                "last_shape": [p.rows, last.shape[1]], **self.header, "sink": stats}

    def _new_pending(self, sample_id: str, input_ids: list[int], aux: torch.Tensor, last: torch.Tensor) -> _Pending:
        """A region for the whole sample, its ids written; the chunks' rows are copied in as they come."""
        layout, size = _layout(len(input_ids), aux, last)
        with self._w.cond:
            offset = self._w.regions.take(size)
        ids, aux_view, last_view = region_views(self._w.base, offset, layout)
        _copy_rows(ids, torch.tensor(input_ids, dtype=torch.int64))
        return _Pending(sample_id, len(input_ids), offset, size, layout, aux_view, last_view)

    def drop(self, rid: str) -> None:
        """Forget a request that was aborted or retracted (its rows will be recomputed)."""
        p = self._pending.pop(rid, None)
        if p is not None:
            with self._w.cond:
                self._w.regions.give(p.offset, p.size)
            self._add_held(-p.nbytes)

    def flush(self) -> None:
        """Wait until every completed sample is written; raises a writer's failure."""
        with self._w.cond:
            self._w.cond.wait_for(lambda: not self._w.jobs or self._w.errors)
        self._raise_writer_error()

    def close(self) -> None:
        """Write what was completed and stop the writer process (also done when the sink is collected)."""
        self._w.close()
        if self._w.proc is not None:
            self._w.proc.wait()

    def _forget_gone(self) -> None:
        while self._gone:
            self.drop(self._gone.pop())

    def _add_held(self, n: int) -> None:
        with self._w.cond:
            self._w.held += n
            self._w.cond.notify_all()

    def _wait_for_budget(self) -> None:
        """Block the scheduler while the sink holds more than its budget and a writer can free some."""
        w = self._w
        with w.cond:
            w.cond.wait_for(lambda: w.held <= self.buffer_bytes or not w.jobs or w.errors)

    def _raise_writer_error(self) -> None:
        if self._w.errors:
            raise RuntimeError(f"eaglebox capture writer failed: {self._w.errors[0]}")


def write_sample(path: Path, input_ids: torch.Tensor | list[int], aux: list[torch.Tensor], last: list[torch.Tensor],
                 header: dict, put=None) -> tuple[str, float, float]:
    """Write one sample's chunks as its final, fsync'd file (the client verifies it and renames it
    into a shard: these are the only writes of its bytes, and this the only hash), or hand the same bytes
    to ``put`` (a transport's, :mod:`eaglebox.shards.transport`) as buffers; returns the tensor sha256 it
    records and the seconds spent hashing and writing."""
    tensors = {"input_ids": [torch.as_tensor(input_ids, dtype=torch.int64)], "aux": aux, "last": last}
    t0 = time.perf_counter()
    digest = tensor_sha256(tensors)
    t1 = time.perf_counter()
    meta = {"rows": str(len(input_ids)), "sha256": digest, "header": json.dumps(header, sort_keys=True),
            "max_abs": json.dumps(max_abs(aux, aux[0].shape[1] // last[0].shape[1]) + max_abs(last, 1))}
    if put is None:
        write_safetensors(path, tensors, meta, fsync=True, file_digest=False)
    else:
        put(safetensors_blobs(tensors, meta, path)[0])
    return digest, t1 - t0, time.perf_counter() - t1


def max_abs(parts: list[torch.Tensor], layers: int) -> list[float]:
    """The largest |value| of each of ``layers`` equal column blocks over the rows of ``parts``; nan or
    inf when one is: the client's feature-health check reads it (``extract/commit.py``)."""
    per_part = [p.reshape(p.shape[0], layers, -1).abs().amax(dim=(0, 2)).float() for p in parts if p.shape[0]]
    return torch.stack(per_part).amax(0).tolist()


def _copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy rows into the sink's shared memory (``dst``: a contiguous view of it, of ``src``'s shape and
    dtype). Host rows: one memmove, with the GIL released (ATen's copy_ into these pages ran at 0.4-0.6
    GB/s on a loaded 2-core machine where memmove ran at 7.9). Device rows are copied on the current
    stream and the copy is waited for (a copy to pageable memory returns once done): once this returns,
    the device memory may be overwritten (a CUDA-graph buffer's next replay) or freed without touching
    what the sink holds."""
    if src.device.type != "cpu":
        dst.copy_(src)
        return
    src = src.contiguous()
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
