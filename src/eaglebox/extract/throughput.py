"""Throughput: how fast a capture went against the disk's raw rate, and what set its pace."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

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
