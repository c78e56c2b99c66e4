"""Start an SGLang server as a subprocess, wait for /health, stream its log to a file, always stop it.

The server runs in its own process group (it forks a scheduler and a detokenizer), so stopping it
kills the whole group: no orphan keeps a port or a core after a test or a crash.
"""

from __future__ import annotations

import ctypes
import functools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from eaglebox.errors import EagleboxError


class ServerError(EagleboxError):
    pass


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")


def without_torchrun(env) -> dict[str, str]:
    """``env`` less torchrun's rendezvous variables: a child process (a server started by rank 0, the
    held-out evaluator) that kept them would join the trainer's store (``TORCHELASTIC_USE_AGENT_STORE``)
    with a process group of its own and wait there for ever."""
    return {k: v for k, v in env.items()
            if k not in TORCHRUN_VARS and not k.startswith(("TORCHELASTIC_", "TORCH_ELASTIC_"))}


class SGLangServer:
    """``with SGLangServer(args, env, log) as srv: requests.post(srv.url + "/generate", ...)``.

    Start it from the main thread: the kernel's parent-death signal follows the starting thread.
    """

    def __init__(self, args: list[str], *, env: dict[str, str], log_path: Path, host: str, port: int,
                 startup_timeout_s: float = 900, writes_to: list[Path] = ()):
        self.args = args
        self.env = env
        self.log_path = Path(log_path)
        self.url = f"http://{host}:{port}"
        self.startup_timeout_s = startup_timeout_s
        self.writes_to = [Path(p) for p in writes_to]
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> SGLangServer:
        return self.launch().wait()

    def launch(self) -> SGLangServer:
        """Starts the process and returns at once (:meth:`wait` for health): servers sharing a GPU start
        side by side."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if healthy(self.url):
            raise ServerError(f"something already answers on {self.url}; stop it or choose another engine.port")
        log = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *self.args],
            env={**without_torchrun(os.environ), **self.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        log.close()
        self._t0 = t0
        return self

    def wait(self) -> SGLangServer:
        t0 = self._t0
        try:
            while not healthy(self.url):
                if self.proc.poll() is not None:
                    raise ServerError(f"SGLang exited with code {self.proc.returncode} before it was healthy; "
                                      f"last lines of {self.log_path}:\n{tail(self.log_path)}")
                if time.monotonic() - t0 > self.startup_timeout_s:
                    raise ServerError(f"SGLang not healthy after {self.startup_timeout_s:.0f} s; "
                                      f"see {self.log_path}:\n{tail(self.log_path)}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            try:  # children that outlived the leader
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc = None

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        died = self.proc is not None and self.proc.poll() is not None
        self.stop()
        if died and isinstance(exc, EagleboxError):  # "the server has exited": say why, from its log
            raise ServerError(f"{exc}: {exit_cause(self.log_path, [self.log_path.parent, *self.writes_to])} "
                              f"(log: {self.log_path})") from exc


def die_with_parent(parent: int) -> None:
    """Runs in a child, before exec or first thing after it: if ``parent``, the process that started it,
    dies, even by kill -9, the kernel kills the child; a parent already gone ends it at once. (An SGLang
    server's own children follow: SGLang sets the same for them.)"""
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def port_open(host: str, port: int, timeout_s: float = 1) -> bool:
    """Whether something listens on ``host:port`` (one TCP connect, nothing sent): how a process that did not
    start a server sees it go (a kill -9 closes its port at once) without asking it anything."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def healthy(url: str) -> bool:
    """Whether the server at ``url`` answers ``/health`` (what :meth:`SGLangServer.wait` waits for)."""
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


EXIT_CAUSES = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied",
               "eaglebox capture writer failed", "out of memory")
"""What stops a server mid-run, most telling first: a full disk reaches the capture writers as
``OSError: [Errno 28] No space left on device`` deep in a scheduler traceback."""


FULL_BYTES = 1 << 20
"""A folder with less free space than this is full: a sample file or a log line does not fit."""


def exit_cause(path: Path, folders: list[Path] = (), n: int = 400) -> str:
    """Why a server stopped: a full disk under one of the ``folders`` it writes to (its log may be
    there, unable to say so), else the last line of its log naming one of :data:`EXIT_CAUSES` (in that
    order of preference), else the last exception line."""
    for folder in folders:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            continue
        if free < FULL_BYTES:
            return f"No space left on device: {free:,} bytes free at {folder}"
    lines = tail(path, n).splitlines()
    for cause in EXIT_CAUSES:
        hits = [line.strip() for line in lines if cause in line]
        if hits:
            return hits[-1][:300]
    errors = [line.strip() for line in lines if re.match(r"\s*[\w.]+(Error|Exception)\b", line)]
    return errors[-1][:300] if errors else "no cause in its log"


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    """A free port for a listener that binds it moments later (an SGLang server, gloo's store). Not one
    from bind(0): the kernel hands out the same ephemeral ports to later bind(0) calls and outgoing
    connections, and once one was taken before the listener bound it (EADDRINUSE: a CI run lost five
    tests; gloo's store in a run beside other work). Below 22000 also stays clear of the range SGLang
    0.5.23 picks its internal ports from (22000-29999)."""
    for port in random.sample(range(10000, 22000), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 10000-21999")
