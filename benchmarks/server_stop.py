"""How long stopping an SGLang server takes, with SGLang 0.5.23's crash diagnostics as it sets them (a 5 s
sleep, py-spy, 60 s for CUDA core dumps: ``SGLANG_*_BEFORE_CRASH=1``) and as eaglebox launches it
(``eaglebox.engine.launch.no_crash_dump_waits``: off where no dump can be made). The tiny target alone on
the CPU, one request, then ``SGLangServer.stop`` (SIGTERM to the group, as every test and command does);
the two settings alternate for several rounds.

``python benchmarks/server_stop.py [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import requests

from eaglebox.config import load_config
from eaglebox.engine.launch import server_for
from eaglebox.engine.server import free_port

ROOT = Path(__file__).resolve().parents[1]
SGLANG_DEFAULTS = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "1", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "1"}


def stop_seconds(logs: Path, name: str, env: dict[str, str]) -> float:
    os.environ.update(env)  # the server's environment; launch_env keeps a setting of its own
    try:
        cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml", [f"engine.port={free_port()}"])
        srv = server_for(cfg, "plain", logs / f"{name}.log").start()
    finally:
        for k in env:
            os.environ.pop(k)
    r = requests.post(srv.url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    r.raise_for_status()
    t0 = time.monotonic()
    srv.stop()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logs", default="/tmp/server-stop")
    a = ap.parse_args()
    logs = Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {"sglang": [], "eaglebox": []}
    for r in range(a.rounds):
        for name in (("sglang", "eaglebox") if r % 2 == 0 else ("eaglebox", "sglang")):
            times[name].append(stop_seconds(logs, f"{name}-{r + 1}", SGLANG_DEFAULTS if name == "sglang" else {}))
        print(f"round {r + 1}: stop with SGLang's crash diagnostics {times['sglang'][-1]:.2f} s, "
              f"as eaglebox launches it {times['eaglebox'][-1]:.2f} s", flush=True)
    print(f"median of {a.rounds}: {statistics.median(times['sglang']):.2f} s -> "
          f"{statistics.median(times['eaglebox']):.2f} s a stop (worst {max(times['sglang']):.2f} -> "
          f"{max(times['eaglebox']):.2f} s)")


if __name__ == "__main__":
    main()
