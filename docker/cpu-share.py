"""What the machine's cores did while make test's pytest ran, from /proc/stat: every process counts, the
SGLang servers' detokenizers too, which init reaps so that ``time`` never sees them, and the containers'
(benchmarks/cpu_accounting.py).

  python3 docker/cpu-share.py start FILE    # before pytest: the counters now, into FILE
  python3 docker/cpu-share.py report FILE   # after: busy, idle, I/O wait and stolen core-seconds since then
"""

import os
import sys
import time

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def counters() -> dict[str, float]:
    with open("/proc/stat") as f:
        values = f.readline().split()[1:]
    tick = os.sysconf("SC_CLK_TCK")
    out = {k: int(v) / tick for k, v in zip(FIELDS, values)}
    out["wall"] = time.time()
    return out


def main() -> None:
    verb, path = sys.argv[1], sys.argv[2]
    if verb == "start":
        now = counters()
        with open(path, "w") as f:
            f.write(" ".join(f"{k}={v}" for k, v in now.items()))
        return
    with open(path) as f:
        then = {k: float(v) for k, v in (kv.split("=") for kv in f.read().split())}
    now = counters()
    d = {k: now[k] - then[k] for k in now}
    cores = os.cpu_count() or 1
    busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
    print(f"make test: pytest's {d['wall']:.0f} s on {cores} cores: busy {busy:.0f} core-s "
          f"({busy / (d['wall'] * cores):.0%}: user {d['user'] + d['nice']:.0f}, system {d['system']:.0f}), "
          f"idle {d['idle']:.0f}, I/O wait {d['iowait']:.0f}, stolen by the host {d['steal']:.0f} (/proc/stat, all processes)")


if __name__ == "__main__":
    main()
