"""How much of an SGLang server's CPU ``/usr/bin/time`` (the parent's rusage of its waited-for children) sees.

``time -v .ci/run`` reports the user and system time of the processes that ``make test`` and its descendants
reaped. A server stopped by a SIGTERM to its process group (as eaglebox stops every server) loses its
launcher, which exits without reaping its detokenizer (init does): the detokenizer's CPU, ~8-11 s of imports a server
start, never reaches that count (the scheduler's does); neither does a container's (its processes are
dockerd's). This starts the tiny target's server as eaglebox does, sends it
``--requests`` generate requests, stops it, and prints the CPU of each of its processes (psutil, read just
before the stop) against what this process's rusage of its children gained.

``OMP_NUM_THREADS=1 python benchmarks/cpu_accounting.py [--requests 16]`` (from the repository root, after ``make tiny``)
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from eaglebox.config import load_config
    from eaglebox.engine.launch import server_for
    from eaglebox.engine.server import free_port

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--log", default="/tmp/cpu-accounting/server.log")
    a = ap.parse_args()
    os.chdir(ROOT)
    Path(a.log).parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml", [f"engine.port={free_port()}"])
    srv = server_for(cfg, "plain", Path(a.log)).start()
    for i in range(a.requests):
        r = requests.post(srv.url + "/generate", json={"input_ids": [1, 2, 3 + i],
                                                      "sampling_params": {"max_new_tokens": 64, "temperature": 0}})
        r.raise_for_status()
    root = psutil.Process(srv.proc.pid)
    seen = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            seen[p.pid] = (p.name(), t.user + t.system)
        except psutil.Error:
            pass
    srv.stop()
    time.sleep(1)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for pid, (name, cpu) in seen.items():
        print(f"  pid {pid} {name}: {cpu:.2f} s CPU")
    total = sum(cpu for _, cpu in seen.values())
    print(f"the server's processes: {total:.2f} s CPU (psutil, before the stop); "
          f"the parent's rusage of reaped children gained {reaped:.2f} s: {reaped / total:.0%} of it is counted")


if __name__ == "__main__":
    main()
