"""Shared fixtures: the tiny CPU target (made once, cached) and a real SGLang server on it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import pytest

# testcontainers reads these when it is imported: no reaper image can be pulled here, and this
# machine looks like a container itself (/.dockerenv), so talk to the engine as the host.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
# SGLang fixes its platform when its modules are first imported (test collection imports some): every
# SGLang code this suite runs in-process (model classes, the draft class) runs on the CPU engine.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / ".cache" / "tiny"
TINY_CONFIG = ROOT / "configs" / "tiny-cpu.yaml"
TINY_MLA = ROOT / ".cache" / "tiny-mla"
TINY_MLA_CONFIG = ROOT / "configs" / "tiny-mla-cpu.yaml"


from eaglebox.engine.server import free_port  # noqa: E402,F401  (tests take it from here)

# Two lanes (make test: pytest -n 2 --dist loadgroup). A test that reads one of these shared fixtures runs
# in that fixture's group, so each is built once, on one worker; any other test runs in its module's group
# (module fixtures stay on one worker). Groups start heaviest first, in this order (their set-up dominates
# the run: docs/testing.md), the rest in collection order, so that the two lanes end close together.
HEAVY_FIRST = ("mla_loop", "cpu_image", "gate", "tiny_shards", "capture_server")


def lane_group(item: pytest.Item) -> str:
    return next((f for f in HEAVY_FIRST if f in item.fixturenames), item.module.__name__)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane_group(item)))
    order = {g: i for i, g in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: order.get(lane_group(item), len(HEAVY_FIRST)))  # stable otherwise


@contextlib.contextmanager
def one_worker_at_a_time(folder: Path):
    """Both lanes may ask for a cached tiny target at once: one copies it, the other waits and finds it."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def config_for_model(tmp_path: Path, model: Path, *overrides: str):
    """A config naming only ``model`` (every other key at its default), with dotted ``overrides``."""
    from eaglebox.config import load_config

    p = tmp_path / "c.yaml"
    p.write_text(f"model:\n  path: {model}\n")
    return load_config(p, list(overrides))


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """The tiny chat target and its data (``eaglebox tiny``): the shipped target copied into .cache/ on first
    use (or after the shipped one changed), and the data set of its corpus written beside it."""
    from eaglebox_dev.tiny import data_current, make_tiny_target, write_chat_data

    with one_worker_at_a_time(TINY):
        make_tiny_target(TINY / "target")
        if not data_current(TINY / "data"):
            write_chat_data(TINY / "data")
    return TINY / "target"


@pytest.fixture(scope="session")
def tiny_mla_target() -> Path:
    """The tiny DeepSeek-V3 (Kimi-shaped) target and its data (``eaglebox tiny --arch deepseek_v3``), cached."""
    from eaglebox_dev.tiny import data_current, write_chat_data
    from eaglebox_dev.tiny_mla import make_tiny_mla_target

    with one_worker_at_a_time(TINY_MLA):
        make_tiny_mla_target(TINY_MLA / "target")
        if not data_current(TINY_MLA / "data"):
            write_chat_data(TINY_MLA / "data")
    return TINY_MLA / "target"


@pytest.fixture(scope="session")
def tiny_cfg_path() -> Path:
    os.chdir(ROOT)  # the config's relative paths are relative to the repository root
    return TINY_CONFIG


def eaglebox_cli(*args: str, timeout: float = 900, env: dict | None = None):
    """Run the CLI as users do (from the repository root); returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "eaglebox.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


GREEDY = ["extract.regenerate_temperature=0", "extract.regenerate_repetition_penalty=1"]
"""Regeneration overrides for tests that train on a small budget: greedy answers, as the served bench and
the gate decode, and the same every run. The demo config samples (varied answers; it trains on 512 samples
for 6 epochs); on 64-96 samples and a few dozen steps, sampled text leaves too little to learn for the
held-out and served margins these tests check (measured in one CI run on sampled answers: held-out AL 1.22
vs 1.05 untrained, bar +0.2; served in the container 1.34 vs 1.05 for the random control, bar +0.3)."""


@pytest.fixture(scope="session")
def tiny_shards(tiny_target, tmp_path_factory) -> Path:
    """64 samples of the tiny target captured by the real SGLang server (once per session), with greedy
    answers (:data:`GREEDY`)."""
    out = tmp_path_factory.mktemp("tiny") / "shards"
    r = eaglebox_cli("extract", "--config", str(TINY_CONFIG), f"extract.output_dir={out}",
                     f"engine.port={free_port()}", "extract.max_samples=64", "extract.shard_size=16",
                     "extract.max_length=320", *GREEDY)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def offline_curve(tiny_shards, tmp_path_factory):
    """The reference of the online tests (``test_online.py``, ``test_online_mooncake.py``): their samples
    trained from ``tiny_shards``, 24 steps; (its output folder, its losses)."""
    from test_online import offline_losses, train_cmd

    out = tmp_path_factory.mktemp("offline") / "offline"
    return out, offline_losses(train_cmd(out, f"extract.output_dir={tiny_shards}"), out)


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory):
    """A real ``mooncake_master`` (the Mooncake package's own binary) on loopback; its ``host:port``."""
    import socket
    import subprocess
    import time

    import mooncake

    port = free_port()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(Path(mooncake.__file__).parent / "mooncake_master"), f"--rpc_port={port}",
                                 "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1", f"--metrics_port={free_port()}",
                                 "--enable_metric_reporting=false", "--rpc_thread_num=4"],
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"mooncake_master not up in 30 s: {log.read_text()[-2000:]}"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def url_server(tiny_target, tiny_cfg_path, mooncake_master, tmp_path_factory):
    """``eaglebox capture-server``, as a user starts one for ``train.online.url``, left running for
    ``test_online.py`` and ``test_online_mooncake.py``; with Mooncake settings, so it serves trainers of either
    transport (file requests go to its spool); (its url, its capture directory: the spool of the file runs
    that use it, the CLI's pid: the server and its writer are its children)."""
    import re
    import signal
    import subprocess
    import sys

    from test_online import SAMPLES

    spool = tmp_path_factory.mktemp("url") / "spool"
    proc = subprocess.Popen([sys.executable, "-m", "eaglebox.cli", "capture-server", "--config", str(tiny_cfg_path),
                             *SAMPLES, f"engine.port={free_port()}", f"train.online.spool_dir={spool}",
                             "train.online.transport=mooncake", f"train.online.mooncake.master={mooncake_master}",
                             f"train.online.mooncake.segment_bytes={MOONCAKE_SEGMENT}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # the CLI prints its url once the server is healthy
            lines.append(line)
            if m := re.match(r"capture-server: (\S+) \(train.online.url\)", line):
                break
        assert m, "".join(lines)[-3000:]
        threading_drain(proc.stdout)
        yield m.group(1), spool, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the CLI stops its server
        try:
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def threading_drain(stream) -> None:
    """Read ``stream`` to its end in the background, so a process writing to a pipe never blocks on it."""
    import threading

    threading.Thread(target=lambda: stream.read(), daemon=True).start()


MOONCAKE_SEGMENT = 32 << 20
"""The url server's share of the Mooncake store: the samples in flight of the tests' trainers (2 MB each)."""


@pytest.fixture(scope="session")
def mla_loop(tiny_mla_target, tmp_path_factory):
    """The Kimi-shaped loop once a session (Triton's interpreter makes each step minutes): ``eaglebox check``
    (capture, train, export, offline AL: one capture server for all of it), then ``eaglebox parity`` on the
    shards it captured, on the tiny DeepSeek-V3 target, timed; (folder, each step's CompletedProcess, seconds).
    ``test_mla_loop.py`` checks the capture and the gate; ``test_mla_served.py`` serves its shards' drafts.
    No ``eaglebox extract`` before the check: its capture is the check's (the same ``capture`` on the same
    config), and a run of its own cost a second server start under the interpreter (docs/testing.md); the verb
    runs on the Llama target (``tiny_shards``, ``test_extract.py``); the MLA form's check on these shards
    (``test_mla_served.py``) finds the capture complete and the held-out samples kept: no server."""
    import json
    import time

    d = tmp_path_factory.mktemp("mla")
    common = ["--config", str(TINY_MLA_CONFIG), f"extract.output_dir={d / 'shards'}",
              f"train.output_dir={d / 'train'}", f"bench.output_dir={d / 'bench'}"]
    steps, times = {}, {}
    for verb in ("check", "parity"):
        t0 = time.monotonic()
        steps[verb] = eaglebox_cli(verb, *common, f"engine.port={free_port()}", timeout=1800)
        times[verb] = round(time.monotonic() - t0, 1)
        if not (d / "shards" / "manifest.json").exists():  # nothing captured: nothing for parity to compare
            break
    print(json.dumps({"seconds": times}))
    return d, steps, times


def small_spec(**changes):
    """A capture spec of a 4-wide target with layers [0, 1, 2] (inputs of 1, 2, 3), ``changes`` applied
    (top-level fields; nested parts as dicts)."""
    from eaglebox.shards.contract import CaptureSpec

    return CaptureSpec.model_validate({
        "engine": "sglang", "engine_version": "0.5.23", "architecture": "LlamaForCausalLM", "layer_rule": "plus_one",
        "layer_ids": [0, 1, 2], "captured_layer_inputs": [1, 2, 3], "hidden_size": 4, "num_layers": 4,
        "dtype": "bfloat16", "dtype_bytes": 2,
        "target": {"config_sha256": "c" * 64, "tokenizer_sha256": "t" * 64, "weights_digest": "w" * 64,
                   "weights_algorithm": "sha256-tree-16MiB"},
        "engine_options": {"quantization": None, "dtype": "bfloat16", "attention_backend": None,
                           "moe_runner_backend": None, "kv_cache_dtype": None, "tp": 1, "dp": 1, "ep": 1},
        **changes})
