"""Online training's samples (``train.data: online | hybrid``, issue 31 on one host): each sample is
captured when the trainer's loader needs it, verified as extraction verifies it, read, and deleted.

The transport (:mod:`eaglebox.shards.transport`, ``train.online.transport``) is the capture server's own files
on one host (below), or across hosts the Mooncake store: the server's writer puts each sample's bytes (the same
file) under a key, the transport's ``fetch`` gets them into this trainer's spool as that file and removes the
key, and from there a sample is checked and read as below. The server is launched exactly as
``eaglebox extract`` launches it (:func:`~eaglebox.extract.run.capture_server`: same spec, radix cache
off), with the spool as its capture directory. :meth:`OnlineSamples.get` sends one sample
(:func:`~eaglebox.extract.http.capture_one`: rows == prompt tokens), waits for its file, checks it as a
commit does (:func:`~eaglebox.extract.commit.verify_staged`: echoed ids == sent ids, the capture header
with target and engine provenance, widths, dtype, health) and reads it hashed whole
(:func:`~eaglebox.shards.format.read_sample`). :meth:`OnlineSamples.get_many` (a batch, for the loader)
sends its samples at once, up to ``extract.concurrency`` over all loader threads, so the server batches
them in prefill as it does for ``eaglebox extract``. The trainer's ``prefetch`` bounds how far ahead that
runs (``train.loader_threads`` batches), so the spool holds at most :func:`in_flight` samples (the
held-out evaluator's one among them) and what hybrid keeps (``kept/``), which stays under
``train.online.budget_bytes`` less room for those in flight.

Everything that needs all samples up front comes from the token ids alone (the plan: data set,
tokenization, regeneration cache): the draft vocabulary, the held-out split and the data digest a
checkpoint records (:func:`~eaglebox.shards.format.samples_digest`), so a resumed run trains on the same
samples in the same order. A trainer killed mid-run leaves files in flight; the next run deletes them
(:func:`clean_spool`). A server that exits (kill -9) is restarted, up to ``train.online.restarts``
times, and the samples in flight are sent again; a server at ``train.online.url`` is waited for with the
client's retries. Either way the run stops with one error naming the cause when it cannot go on.

Under ``torchrun`` every rank captures only the samples its own slice of each batch needs, through one
server: rank 0 starts it (and restarts it) or all use ``train.online.url``. The other ranks cannot poll rank
0's server process; they watch its port (:class:`Listening`): when it closes, they wait up to
``engine.startup_timeout_s`` for rank 0's restart to answer ``/health`` and send their samples in flight
again, or stop naming the url and the wait. Each rank's files live in ``spool/rank<R>/`` (the
request names the file, so two ranks never share one, even when an epoch's last batch on one rank and the
next epoch's first on another hold the same sample), and each rank gets ``budget_bytes / world`` of the
budget, so the whole spool stays under it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import torch

from eaglebox.engine.server import healthy, port_open
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import drop_partial_files, feature_bound, verify_staged
from eaglebox.extract.http import Client, capture_one
from eaglebox.extract.plan import Planned, bytes_per_token
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.format import ShardError, read_sample, samples_digest
from eaglebox.shards.transport import (
    EVICTION_HIGH_WATERMARK,
    FileTransport,
    MooncakeTransport,
    TransportError,
)

KEPT = "kept"
HEADER_BYTES = 64 << 10
"""Room for a sample file's header (the capture spec, sha256, largest values: a few KiB) in the budget."""


def in_flight(cfg) -> int:
    """Samples captured at once at most: the loader's (``extract.concurrency``, or fewer when its threads'
    batches hold fewer) plus the held-out evaluator's one."""
    t = cfg.train
    return min(cfg.extract.concurrency, t.loader_threads * t.batch_size) + 1


def in_flight_reserve(max_length: int, spec: CaptureSpec, samples: int) -> int:
    """Disk the samples in flight may take at once: ``samples`` files of the longest sample."""
    bpt = bytes_per_token(spec.hidden_size, len(spec.layers.layer_ids), spec.dtype_bytes)
    return samples * (max_length * bpt + HEADER_BYTES)


def in_flight_words(flying: int, max_length: int, reserve: int, ranks: str = "") -> str:
    """How the samples in flight add up to ``reserve`` bytes, as both budget errors say it."""
    return (f"{flying}{ranks} (extract.concurrency, at most train.loader_threads x train.batch_size, + 1) "
            f"of up to {max_length} tokens (extract.max_length) are {reserve:,} bytes")


def check_segment(segment: int, reserve: int, flying: int, max_length: int, world: int) -> None:
    """The Mooncake segment the capture server lends the store holds every rank's samples in flight below
    the master's eviction watermark (past it, samples not yet read may be evicted)."""
    if reserve > EVICTION_HIGH_WATERMARK * segment:
        ranks = f" for each of {world} ranks" if world > 1 else ""
        raise ExtractError(f"train.online.mooncake.segment_bytes={segment:,} cannot hold the samples in flight: "
                           f"{in_flight_words(flying, max_length, reserve, ranks)}, over the "
                           f"{EVICTION_HIGH_WATERMARK:.0%} of the segment the master fills before it evicts; set it to "
                           f"at least {int(reserve / EVICTION_HIGH_WATERMARK) + 1:,}")


def clean_spool(spool: Path, keep: bool) -> None:
    """What a killed trainer or server left: files being written, samples in flight (captured again when
    needed); without ``keep`` (online), hybrid's kept samples too."""
    spool.mkdir(parents=True, exist_ok=True)
    drop_partial_files(spool)
    for f in spool.glob("*.safetensors"):
        f.unlink()
    if not keep:
        shutil.rmtree(spool / KEPT, ignore_errors=True)
    else:
        (spool / KEPT).mkdir(exist_ok=True)


def clean_other_ranks(spool: Path, world: int) -> None:
    """Rank 0: what a run at another world size left (one rank's files at the top, or ``rank<R>/`` folders
    this run has no rank for), so that the budget holds for the whole spool; a checkpoint resumes only at
    the world size that wrote it."""
    ours = {rank_dir(r, world) for r in range(world)}
    spool.mkdir(parents=True, exist_ok=True)
    for d in spool.iterdir():
        if d.is_dir() and re.fullmatch(r"rank\d+", d.name) and d.name not in ours:
            shutil.rmtree(d)
    if world > 1:
        clean_spool(spool, keep=False)


def rank_dir(rank: int, world: int) -> str:
    """A rank's folder under the spool; one rank uses the spool itself (so one-rank runs resume as before)."""
    return f"rank{rank}" if world > 1 else ""


class Listening:
    """Rank 0's capture server as another rank sees it (it cannot poll a process it did not start): up while
    its port accepts a TCP connection, checked at most every ``every_s`` however many threads ask (a file
    wait asks every 5 ms); ``closed`` counts the checks that found it closed."""

    def __init__(self, url: str, every_s: float = 0.2):
        u = urlsplit(url)
        self.url, self.host, self.port, self.every_s = url, u.hostname, u.port, every_s
        self.closed = 0
        self._up, self._at = True, float("-inf")
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            if time.monotonic() - self._at < self.every_s:
                return self._up
        return self.check()

    def check(self) -> bool:
        """Whether it listens, asked now."""
        up = port_open(self.host, self.port)
        with self._lock:
            self._up, self._at = up, time.monotonic()
            self.closed += not up
        return up


class OnlineSamples:
    """:class:`~eaglebox.shards.format.ShardReader`'s interface (``len``, ``get``, ``ids_and_mask``,
    ``rows``, ``capture``, ``digest``, ``report``) over samples captured on demand. ``budget`` None keeps
    nothing (online); otherwise samples are kept in ``kept/`` of its folder while kept + ``reserve`` fits in it.
    ``concurrency`` bounds the captures :meth:`get_many` has in flight, over all the threads that call it.
    ``spool`` is the server's capture directory; this reader's files are in ``spool/rank_dir``. ``server``: the
    one this rank started, restarted up to ``restarts`` times; ``shared``: rank 0's, waited for up to
    ``wait_s`` when its port closes."""

    def __init__(self, planned: list[Planned], spec: CaptureSpec, client: Client, spool: Path, bound: float | None, *,
                 budget: int | None, reserve: int, concurrency: int = 1, server=None,
                 keeper: ThreadPoolExecutor | None = None, restarts: int = 0, rank_dir: str = "",
                 shared: Listening | None = None, wait_s: float = 900, log=print, transport=None):
        self.capture, self.client, self.spool, self.bound = spec, client, Path(spool), bound
        self.transport = transport or FileTransport(spool)
        self.rank_dir, self.folder = rank_dir, Path(spool) / rank_dir
        self.budget, self.reserve, self.server, self.keeper = budget, reserve, server, keeper
        self.restarts, self.shared, self.wait_s, self.log = restarts, shared, wait_s, log
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="eaglebox-capture")
        # the plan as flat tensors (ShardReader's index holds them so too): 9 bytes a token, not Python lists
        self._sids = [p.id for p in planned]
        self._lines = [p.line for p in planned]
        self._offsets = [0]
        for p in planned:
            self._offsets.append(self._offsets[-1] + len(p.input_ids))
        self._ids = torch.tensor([t for p in planned for t in p.input_ids], dtype=torch.int64)
        self._masks = torch.tensor([m for p in planned for m in p.loss_mask], dtype=torch.uint8)
        self._digest = samples_digest(spec, [(p.id, p.loss_mask) for p in planned])
        self._locks = [threading.Lock() for _ in planned]  # an epoch's last batch and the next's first may share one
        self._lock = threading.Lock()  # the byte accounting
        self._restart_lock = threading.Lock()
        self._generation, self._restarted = 0, 0
        self._kept: dict[str, int] = {}  # sample id -> bytes, in kept/
        self._kept_bytes = self._in_flight = 0
        self.stats = {"captured": 0, "from_disk": 0, "high_water_bytes": 0, "server_restarts": 0}
        if budget is not None:
            self._load_kept()

    def _load_kept(self) -> None:
        """Kept samples of an earlier run of this data, within the budget; the rest deleted."""
        wanted = set(self._sids)
        for f in sorted((self.folder / KEPT).iterdir()):
            size = f.stat().st_size
            if f.name.endswith(".safetensors") and f.stem in wanted and self._fits(size):
                self._kept[f.stem] = size
                self._kept_bytes += size
            else:
                f.unlink()

    def _fits(self, size: int) -> bool:
        """Hybrid keeps a sample while the kept ones and room for those in flight stay within the budget."""
        return self.budget is not None and self._kept_bytes + size + self.reserve <= self.budget

    def __len__(self) -> int:
        return len(self._sids)

    def rows(self, i: int) -> int:
        return self._offsets[i + 1] - self._offsets[i]

    def ids_and_mask(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``i``'s token ids and loss mask, from the plan (nothing captured)."""
        a, b = self._offsets[i], self._offsets[i + 1]
        return self._ids[a:b], self._masks[a:b]

    def digest(self) -> str:
        return self._digest

    def report(self) -> dict:
        return {"data": "online" if self.budget is None else "hybrid", "transport": self.transport.kind,
                "spool": str(self.folder),
                "budget_bytes": self.budget, "kept_samples": len(self._kept), "kept_bytes": self._kept_bytes,
                **self.stats}

    def planned(self, i: int) -> Planned:
        ids, mask = self.ids_and_mask(i)
        return Planned(self._sids[i], self._lines[i], ids.tolist(), mask.tolist())

    def get(self, i: int, max_rows: int | None = None) -> dict[str, torch.Tensor]:
        """Sample ``i`` verified: read from ``kept/`` (hybrid) or captured now; cut to ``max_rows``."""
        p = self.planned(i)
        with self._locks[i]:
            s = self._read_kept(p) if p.id in self._kept else None
            if s is None:
                s = self._capture(p)
        ids, mask = self.ids_and_mask(i)
        n = min(len(ids), max_rows) if max_rows else len(ids)
        return {"input_ids": ids[:n], "loss_mask": mask[:n], "aux": s["aux"][:n], "last": s["last"][:n]}

    def get_many(self, indices: list[int], max_rows: int | None = None) -> list[dict[str, torch.Tensor]]:
        """:meth:`get` of each of ``indices``, in order, sent at once (one request after another left the
        server's prefill a batch of one per loader thread); the first failure in order is raised."""
        return list(self._pool.map(lambda i: self.get(i, max_rows), indices))

    def close(self) -> None:
        """Cancel the captures not begun (a failed batch's rest) and wait for those running."""
        self._pool.shutdown(cancel_futures=True)

    def _verify(self, path: Path, p: Planned) -> dict[str, torch.Tensor]:
        """Extraction's checks from the header and ids (:func:`verify_staged`), then every byte hashed."""
        digest = verify_staged(path, p, self.capture, self.bound)
        try:
            return read_sample(path, digest, len(p.input_ids), self.capture)
        except ShardError as err:
            raise ExtractError(f"sample at line {p.line}: {err}") from None

    def _read_kept(self, p: Planned) -> dict[str, torch.Tensor] | None:
        path = self.folder / KEPT / f"{p.id}.safetensors"
        try:
            s = self._verify(path, p)
        except (ExtractError, ShardError, OSError) as err:  # damaged since: it is captured again
            self.log(f"train: {err}; capturing it again")
            path.unlink(missing_ok=True)
            with self._lock:
                self._kept_bytes -= self._kept.pop(p.id, 0)
            return None
        with self._lock:
            self.stats["from_disk"] += 1
        return s

    def _capture(self, p: Planned) -> dict[str, torch.Tensor]:
        path = self.folder / f"{p.id}.safetensors"
        name = self.transport.request_name(f"{self.rank_dir}/{p.id}" if self.rank_dir else p.id)
        while True:
            generation, closed = self._generation, self.shared.closed if self.shared else 0
            try:
                capture_one(self.client, p, name)
                try:
                    self.transport.fetch(name, path, alive=self._alive)
                except TransportError as err:
                    raise ExtractError(f"sample at line {p.line}: {err}") from None
                break
            except ExtractError as err:
                if self.server is not None:
                    self._restart(generation, err)
                elif self.shared is not None:
                    self._await_restart(closed, err)
                else:
                    raise  # a server at train.online.url: the client's retries were the wait
            path.unlink(missing_ok=True)  # what the dead server wrote of it, if anything: the new one writes it
        size = path.stat().st_size
        with self._lock:
            self._in_flight += size
            self.stats["high_water_bytes"] = max(self.stats["high_water_bytes"], self._in_flight + self._kept_bytes)
        try:
            s = self._verify(path, p)
            with self._lock:
                self.stats["captured"] += 1
                if self._fits(size):
                    os.replace(path, self.folder / KEPT / path.name)
                    self._kept[p.id] = size
                    self._kept_bytes += size
            return s
        finally:
            path.unlink(missing_ok=True)  # gone already when kept
            with self._lock:
                self._in_flight -= size

    def _alive(self) -> bool:
        if self.server is not None:
            return self.server.alive()
        return self.shared is None or self.shared()

    def _await_restart(self, closed: int, err: Exception) -> None:
        """Another rank's side of rank 0's restart: re-raise ``err`` when rank 0's server kept listening
        through the attempt (``closed`` checks before it; a failure of its own); otherwise wait, once for all
        this rank's threads, up to ``wait_s`` for it to answer ``/health`` again, and try again."""
        s = self.shared
        if s.closed == closed and s.check():
            time.sleep(0.5)  # a kill -9 resets the connections as it closes the port: look again
            if s.check():
                raise err
        with self._restart_lock:
            if healthy(s.url):
                return  # back (another thread of this rank waited for it): try again
            self.log(f"train: {self.rank_dir}: the capture server at {s.url} stopped listening ({err}); waiting up "
                     f"to {self.wait_s:.0f} s (engine.startup_timeout_s) for rank 0 to start it again, then "
                     "sending this rank's samples in flight again")
            t0 = time.monotonic()
            while not healthy(s.url):
                if time.monotonic() - t0 > self.wait_s:
                    raise ExtractError(f"the capture server at {s.url}, started by rank 0, stopped listening and did "
                                       f"not answer again within {self.wait_s:.0f} s (engine.startup_timeout_s); "
                                       "rank 0's output and its capture-server.log say why") from err
                time.sleep(0.5)
            s.check()
            self.log(f"train: {self.rank_dir}: the capture server at {s.url} answers again after "
                     f"{time.monotonic() - t0:.0f} s")

    def _restart(self, generation: int, err: Exception) -> None:
        """Start the server again, once for all the threads whose attempt (begun in ``generation``) failed
        with it; re-raise ``err`` when the server is up and was not restarted since (a failure of its own).
        On the keeper thread: the kernel's parent-death signal follows the thread that started it."""
        from eaglebox.engine.server import exit_cause

        with self._restart_lock:
            if generation != self._generation:
                return  # another thread restarted it meanwhile: try again
            if self.server.alive():
                raise err
            proc = self.server.proc
            code = f"exit code {proc.returncode}; " if proc is not None and proc.returncode is not None else ""
            cause = f"{code}its log's last error: {exit_cause(self.server.log_path, [self.spool])}"
            if self._restarted >= self.restarts:
                raise ExtractError(f"the capture server exited and train.online.restarts={self.restarts} restarts "
                                   f"are used up; cause: {cause} (log: {self.server.log_path})") from err
            self._restarted += 1
            self.stats["server_restarts"] = self._restarted
            self.log(f"train: the capture server exited ({cause}); restarting it "
                     f"({self._restarted} of {self.restarts})")
            self.keeper.submit(self._relaunch).result()
            self._generation += 1

    def _relaunch(self) -> None:
        self.server.stop()
        for folder in [self.spool, *(d for d in self.spool.glob("rank*") if d.is_dir())]:
            drop_partial_files(folder)  # a writer killed mid-file, for any rank
        self.server.start()


def check_server(first: Planned, spec: CaptureSpec, client: Client, spool: Path, bound: float | None,
                 url: str | None, server, keeper: ThreadPoolExecutor, rank_dir: str = "", transport=None) -> None:
    """Capture and verify the first sample before the trainer writes anything: a server launched for
    another spec (target, engine, layers) or answering for other ids is refused here in one error, naming
    ``train.online.url`` when the server is the user's, and leaves no partial run behind."""
    probe = OnlineSamples([first], spec, client, spool, bound, budget=None, reserve=0, server=server,
                          keeper=keeper, rank_dir=rank_dir, transport=transport)
    try:
        probe.get(0)
    except ExtractError as err:
        if url is None:
            raise
        raise ExtractError(f"train.online.url={url}: {err}") from None
    finally:
        probe.close()


def spool_of(cfg) -> Path:
    """``train.online.spool_dir``, or ``train.output_dir/spool``."""
    return Path(cfg.train.online.spool_dir or Path(cfg.train.output_dir) / "spool")


def online_capture_server(cfg, spec: CaptureSpec, spool: Path):
    """The (unstarted) capture server of online training, writing files to ``spool`` and, when
    ``train.online.transport`` is mooncake, able to put samples in the store: what ``eaglebox train`` starts
    for itself and ``eaglebox capture-server`` for a ``train.online.url``."""
    from eaglebox.extract.run import capture_server
    from eaglebox.shards.transport import server_env

    o = cfg.train.online
    return capture_server(cfg, spec, Path(cfg.train.output_dir) / "capture-server.log", capture_dir=spool,
                          transport_env=server_env(o.mooncake.model_dump()) if o.transport == "mooncake" else None)


@contextmanager
def online_samples(cfg, spec: CaptureSpec, log=print, *, rank: int = 0, world: int = 1,
                   share=lambda obj: obj) -> Iterator[OnlineSamples]:
    """The samples of ``cfg``'s extract section, captured on demand for ``cfg.train`` (its
    ``data: online | hybrid`` and ``online`` section); rank 0 starts (and finally stops) the capture server
    unless ``train.online.url`` names one. ``share``: rank 0's value on every rank (the server's url, once
    it is up and the regenerated answers are cached for the other ranks)."""
    from eaglebox.extract.run import planned_samples, prepare
    from eaglebox.target.tokenizer import load_tokenizer

    e, t, o = cfg.extract, cfg.train, cfg.train.online
    if e.dataset is None:
        raise ExtractError("extract.dataset: required for train.data online or hybrid (the samples are extract's)")
    spool = spool_of(cfg)
    mine = rank_dir(rank, world)
    flying = in_flight(cfg)
    reserve = in_flight_reserve(e.max_length, spec, flying)
    budget = None if o.budget_bytes is None else o.budget_bytes // world
    if budget is not None and reserve > budget:
        split = f" a rank, and each of the {world} ranks has 1/{world} of the budget, {budget:,}" if world > 1 else ""
        raise ExtractError(f"train.online.budget_bytes={o.budget_bytes:,} cannot hold the samples in flight: "
                           f"{in_flight_words(flying, e.max_length, reserve)}{split}")
    mooncake = o.transport == "mooncake"
    if mooncake:
        check_segment(o.mooncake.segment_bytes, in_flight_reserve(e.max_length, spec, flying * world), flying,
                      e.max_length, world)
        transport = MooncakeTransport(o.mooncake.model_dump(), mount=False)  # refuses a master that does not answer
        transport.clean(f"{mine}/" if mine else "")  # what a killed run of this rank left in the store
    else:
        transport = FileTransport(spool)
    say, log = log, log if rank == 0 else (lambda *a: None)  # say: what each rank tells of its own samples
    tokenizer = load_tokenizer(cfg.model)
    plan = prepare(e, spec, tokenizer, log, store=False)
    bound = feature_bound(cfg.model.path)
    if rank == 0:
        clean_other_ranks(spool, world)
    clean_spool(spool / mine, keep=t.data == "hybrid")
    server = None if o.url or rank else online_capture_server(cfg, spec, spool)
    keeper = ThreadPoolExecutor(1, thread_name_prefix="eaglebox-capture-server")
    samples = shared = None
    try:
        if rank == 0:
            try:
                if server is not None:
                    log(f"train: starting the capture server (SGLang {spec.engine_version}, layer ids "
                        f"{list(spec.layers.layer_ids)}); spool {spool}, log {server.log_path}")
                    keeper.submit(server.start).result()
                url = o.url or server.url
                alive = server.alive if server is not None else (lambda: True)
                planned = planned_samples(e, url, spec, tokenizer, plan, alive=alive, log=log)
            except BaseException:
                share(None)  # the other ranks stop too
                raise
            share(url)
        else:
            url = share(None)
            if url is None:
                raise ExtractError("rank 0 could not start the capture server or plan the samples (its error says why)")
            # rank 0's server: this rank sees it stop as its port closes and waits for rank 0's restart; a
            # server at train.online.url is waited for with the client's retries
            shared = None if o.url else Listening(url)
            alive = shared or (lambda: True)
            planned = planned_samples(e, url, spec, tokenizer, plan, alive=alive, log=log)
        client = Client(url, e.max_retries, e.retry_backoff_s, alive)
        check_server(planned[0], spec, client, spool, bound, o.url, server, keeper, mine, transport)
        samples = OnlineSamples(planned, spec, client, spool, bound,
                                budget=budget if t.data == "hybrid" else None, reserve=reserve,
                                concurrency=e.concurrency, server=server, keeper=keeper, restarts=o.restarts,
                                rank_dir=mine, shared=shared, wait_s=cfg.engine.startup_timeout_s, log=say,
                                transport=transport)
        log(f"train: {t.data}: {len(samples)} samples captured as the loader needs them"
            + (f", through the Mooncake store at {o.mooncake.master}" if mooncake else "")
            + (f" ({world} ranks, each its own slice of each batch, files in {spool}/rank<R>/)" if world > 1 else "")
            + (f"; up to {budget:,} bytes a rank kept in {spool / mine / KEPT} "
               f"({samples.report()['kept_samples']} there now)" if t.data == "hybrid" else ""))
        yield samples
    finally:
        if samples is not None:
            samples.close()
        if server is not None:
            keeper.submit(server.stop).result()
        keeper.shutdown()
        clean_spool(spool / mine, keep=t.data == "hybrid")
        if mooncake:
            transport.clean(f"{mine}/" if mine else "")
            transport.close()
