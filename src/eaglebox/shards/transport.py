"""How a captured sample's bytes go from the capture server to an online trainer (issue 31 item 2).

Two transports behind one small interface; the bytes are the same either way (one safetensors file per
sample, :func:`eaglebox.capture.sink.write_sample`), and the trainer verifies them the same way (ids, rows,
layers, hash, provenance: :mod:`eaglebox.extract.online`):

- ``put(name, blobs)`` -- the server (the capture sink's writer process) stores one sample's bytes, given as
  buffers to concatenate;
- ``request_name(name)`` -- the trainer: what its capture request carries (the server's ``put`` gets it);
- ``fetch(name, dest, alive, wait_s)`` -- the trainer: wait for the sample, leave its bytes as the local
  file ``dest`` and free the server's copy;
- ``close()``.

:class:`FileTransport` is the capture directory on a file system both sides see (one host, or a shared
one): ``<folder>/<name>.safetensors``, written atomically and fsynced; ``fetch`` waits for it (it already
is ``dest``). :class:`MooncakeTransport` is the Mooncake store (``mooncake-transfer-engine-non-cuda``), for
hosts that share no file system: the server's writer process mounts ``segment_bytes`` of its memory into
the store and puts each sample under the key ``<key_prefix>/<name>``; the trainer (which mounts nothing)
gets it by key over Mooncake's TCP transfer engine, writes it to its local spool and removes the key.
The server learns the store's settings from ``EAGLEBOX_CAPTURE_MOONCAKE`` (:func:`server_env`), and takes
each request's transport from its name (:class:`SinkTransport`: ``mooncake:<key>`` or a file's name), so one
server launched with those settings feeds trainers of either transport.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path

from eaglebox.errors import EagleboxError
from eaglebox.shards.format import atomic_file

ENV = "EAGLEBOX_CAPTURE_MOONCAKE"
SCHEME = "mooncake:"
"""What a request's name starts with when its sample goes to the Mooncake store (the rest is the key)."""
PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
MIN_SEGMENT_BYTES = 16 << 20
"""Mooncake 0.3.13 refuses a smaller segment at ``setup`` ("Total size must be at least 16777216")."""
EVICTION_HIGH_WATERMARK = 0.9
"""``mooncake_master``'s default ``eviction_high_watermark_ratio``: past it the master may evict objects
(samples not yet read), so the samples in flight must fit below it."""
NO_SPACE = -200
"""``put``'s code when no mounted segment has room (the trainer has not freed enough yet)."""


class TransportError(EagleboxError):
    pass


def wait_until(ready, what: str, wait_s: float, alive) -> None:
    deadline = time.monotonic() + wait_s
    while not ready():
        if not alive():
            raise TransportError(f"{what}: the SGLang server exited before it stored it")
        if time.monotonic() > deadline:
            raise TransportError(f"{what}: not there within {wait_s:.0f} s of its answer")
        time.sleep(0.005)


class FileTransport:
    kind = "file"

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def request_name(self, name: str) -> str:
        return name

    def put(self, name: str, blobs: list) -> None:
        with atomic_file(self.folder / f"{name}.safetensors", fsync=True) as f:
            for b in blobs:
                f.write(b)

    def fetch(self, name: str, dest: Path, alive=lambda: True, wait_s: float = 120) -> None:
        path = self.folder / f"{name}.safetensors"
        wait_until(path.exists, f"{path}", wait_s, alive)
        if path != Path(dest):
            os.replace(path, dest)

    def close(self) -> None:
        pass


def load_mooncake():
    """The Mooncake store class, or an error saying what to install."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as err:
        if "libibverbs" in str(err):
            raise TransportError(f"train.online.transport: mooncake: the Mooncake package is installed but cannot "
                                 f"load ({err}); install the system package libibverbs1 "
                                 "(apt-get install libibverbs1)") from None
        raise TransportError(f"train.online.transport: mooncake needs the Python package {PACKAGE.split('==')[0]} "
                             f"(pip install '{PACKAGE}', or `make venv`), and the system package libibverbs1 "
                             f"({err})") from None
    return MooncakeDistributedStore


def route_address(master: str) -> str:
    """This host's address on the route to the master (what other hosts reach it at); no packet is sent."""
    host, port = master.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))
        return s.getsockname()[0]


def server_env(settings: dict) -> dict[str, str]:
    """What the capture server's environment carries for :class:`MooncakeTransport` (its ``put`` side)."""
    return {ENV: json.dumps(settings, sort_keys=True)}


class MooncakeTransport:
    """``settings``: ``train.online.mooncake`` as a dict (master, metadata_server, local_hostname,
    segment_bytes, connect_timeout_s, key_prefix). ``mount``: the server mounts ``segment_bytes`` (the
    samples live in its memory until read); the trainer mounts nothing. Both use a local transfer buffer of
    ``segment_bytes`` (a put or get goes through it whole)."""

    kind = "mooncake"

    def __init__(self, settings: dict, *, mount: bool):
        self.settings, self.prefix = settings, settings["key_prefix"]
        self.master = settings["master"]
        store_cls = load_mooncake()
        self._probe_master()
        self.store = store_cls()
        local = settings.get("local_hostname") or route_address(self.master)
        seg = settings["segment_bytes"]
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(self.store.setup(
            local, settings["metadata_server"], seg if mount else 0, seg, "tcp", "", self.master)), daemon=True)
        t.start()
        t.join(settings["connect_timeout_s"])
        if not done:
            raise TransportError(f"train.online.mooncake.master={self.master}: something answers there but Mooncake's "
                                 f"setup did not finish within {settings['connect_timeout_s']:.0f} s "
                                 "(train.online.mooncake.connect_timeout_s); is it a mooncake_master?")
        if done[0] != 0:
            raise TransportError(f"train.online.mooncake: Mooncake's setup failed with code {done[0]} (master "
                                 f"{self.master}, metadata server {settings['metadata_server']}, this host as "
                                 f"{local}, segment {seg:,} bytes)")

    def _probe_master(self) -> None:
        """Refuse within ``connect_timeout_s`` when nothing listens at the master's address (Mooncake's own
        setup retries for ~90 s first)."""
        host, port = self.master.rsplit(":", 1)
        wait_s = self.settings["connect_timeout_s"]
        deadline = time.monotonic() + wait_s
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                return
            except OSError as err:
                if time.monotonic() > deadline:
                    raise TransportError(f"train.online.mooncake.master={self.master}: no Mooncake master answers "
                                         f"there within {wait_s:.0f} s ({err}); start one (mooncake_master "
                                         f"--rpc_port={port}) or set the key to its host:port") from None
                time.sleep(0.2)

    def request_name(self, name: str) -> str:
        return f"{SCHEME}{self.prefix}/{name}"

    def put(self, name: str, blobs: list, wait_s: float = 300) -> None:
        """Store one sample under ``name``, replacing what is there (the last capture of a sample wins, as a file
        renamed over another; a plain ``put`` to an existing key keeps the old bytes and says 0); while no
        segment has room (the trainer frees as it reads), wait."""
        name = name.removeprefix(SCHEME)
        deadline = time.monotonic() + wait_s
        while (rc := self.store.upsert_parts(name, *blobs)) == NO_SPACE and time.monotonic() < deadline:
            time.sleep(0.05)
        if rc != 0:
            size = sum(len(memoryview(b).cast("B")) for b in blobs)
            raise TransportError(f"Mooncake put of {name} ({size:,} bytes) failed with code {rc}"
                                 + (f" (no room in {wait_s:.0f} s)" if rc == NO_SPACE else ""))

    def fetch(self, name: str, dest: Path, alive=lambda: True, wait_s: float = 120) -> None:
        name = name.removeprefix(SCHEME)
        got: list[bytes] = []

        def ready() -> bool:
            if self.store.is_exist(name) != 1:
                return False
            data = self.store.get(name)
            if data:
                got.append(data)
            return bool(data)

        wait_until(ready, f"Mooncake key {name}", wait_s, alive)
        try:
            with atomic_file(Path(dest), fsync=False) as f:
                f.write(got[0])
        finally:
            self.store.remove(name, True)  # force: reading it took a lease the master would otherwise wait out

    def clean(self, name_prefix: str) -> None:
        """Remove the keys under ``<key_prefix>/<name_prefix>`` that a killed run left."""
        self.store.remove_by_regex("^" + re.escape(f"{self.prefix}/{name_prefix}"), True)

    def close(self) -> None:
        self.store.close()


class SinkTransport:
    """The server's side: a request named ``mooncake:<key>`` (:meth:`MooncakeTransport.request_name`) goes to
    the Mooncake store, when the server was launched with its settings (:func:`server_env`; its writer
    process then connects and mounts its segment at start); any other to the capture directory ``folder``.
    So one server feeds trainers of either transport."""

    def __init__(self, folder: str | Path):
        raw = os.environ.get(ENV)
        self.files = FileTransport(folder)
        self.store = MooncakeTransport(json.loads(raw), mount=True) if raw else None

    def put(self, name: str, blobs: list) -> None:
        if not name.startswith(SCHEME):
            return self.files.put(name, blobs)
        if self.store is None:
            raise TransportError(refused_here(name))
        self.store.put(name, blobs)


def refused_here(name: str) -> str | None:
    """Why this server cannot deliver a request named ``name``, or None: a Mooncake name reaching a server
    launched without the store's settings. The capture hook answers such a request with this reason before
    it captures, so a trainer misconfigured against a shared server is refused instead of stopping it."""
    if name.startswith(SCHEME) and not os.environ.get(ENV):
        return (f"{name}: this capture server was launched without Mooncake settings (a trainer with "
                "train.online.transport: mooncake starts its own with them; a server at train.online.url must be "
                "launched with them too: eaglebox capture-server with train.online.transport=mooncake)")
    return None
