"""How fast the online reader captures a batch's samples (issue 31 follow-up): one sample after another
(the loader before ``OnlineSamples.get_many``) vs a batch's samples sent at once, up to
``extract.concurrency`` (today's), through one real SGLang capture server on the tiny CPU target.

Two shapes, each side by side in one run after one unmeasured pass over the samples (the server's first
prefills are slower):

- ``one batch``: a single caller takes the batches in order (the loader's critical path: a step waits for
  its own batch); serial and concurrent alternate batch by batch (which goes first too), so that a
  neighbour's load on a shared machine falls on both alike;
- ``loader``: the trainer's ``prefetch`` with ``train.loader_threads`` threads, one batch each, as the
  training loop runs it; serial and concurrent alternate which goes first per round.

The first round also checks that both give the same samples in the same order, byte for byte. Prints each
round's samples/s and the worst round of each ratio (concurrent / serial).

    python benchmarks/online_capture.py [--samples 64] [--rounds 3] [--concurrency 8] [--batch 8] [--threads 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="extract.concurrency (today's bound)")
    ap.add_argument("--batch", type=int, default=8, help="train.batch_size")
    ap.add_argument("--threads", type=int, default=4, help="train.loader_threads")
    a = ap.parse_args()

    import torch

    from eaglebox.config import load_config
    from eaglebox.engine.server import free_port
    from eaglebox.extract.online import online_samples
    from eaglebox.shards.spec import capture_spec
    from eaglebox.train.data import prefetch
    from eaglebox_dev.tiny import data_current, make_tiny_target, write_chat_data

    os.chdir(ROOT)  # the config's relative paths
    tiny = ROOT / ".cache" / "tiny"
    make_tiny_target(tiny / "target")
    if not data_current(tiny / "data"):
        write_chat_data(tiny / "data")
    work = Path(tempfile.mkdtemp(prefix="online-capture-"))
    cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml", [
        f"engine.port={free_port()}", f"extract.output_dir={work / 'extract'}", f"train.output_dir={work / 'train'}",
        f"extract.max_samples={a.samples}", "extract.max_length=320", "extract.regenerate=false",
        f"extract.concurrency={a.concurrency}", f"train.batch_size={a.batch}", f"train.loader_threads={a.threads}",
        "train.data=online"])
    batches = [list(range(i, i + a.batch)) for i in range(0, a.samples - a.batch + 1, a.batch)]
    n = sum(map(len, batches))

    with online_samples(cfg, capture_spec(cfg), log=lambda *m: None) as s:
        def serial(b):
            return [s.get(i) for i in b]

        def concurrent(b):
            return s.get_many(b)

        def timed(fn, arg):
            t0 = time.monotonic()
            return fn(arg), time.monotonic() - t0

        def one_batch(rnd):
            """Both modes batch by batch, alternating which goes first: (samples, seconds) of each."""
            got, spent = {"serial": [], "concurrent": []}, {"serial": 0.0, "concurrent": 0.0}
            for k, b in enumerate(batches):
                order = [("serial", serial), ("concurrent", concurrent)]
                for mode, fn in order[::-1] if (rnd + k) % 2 else order:
                    out, dt = timed(fn, b)
                    got[mode].append(out)
                    spent[mode] += dt
            return got, spent

        def loader(rnd):
            """The loop's prefetch over all batches, one mode after the other, alternating per round."""
            got, spent = {}, {}
            order = [("serial", serial), ("concurrent", concurrent)]
            for mode, fn in order[::-1] if rnd % 2 else order:
                got[mode], spent[mode] = timed(lambda f: [r for _, r in prefetch(f, batches, a.threads)], fn)
            return got, spent

        one_batch(0)  # unmeasured: the server's first prefills
        shapes = {"one batch": one_batch, "loader": loader}
        rates = {(shape, mode): [] for shape in shapes for mode in ("serial", "concurrent")}
        for rnd in range(1, a.rounds + 1):
            for shape, run in shapes.items():
                got, spent = run(rnd)
                for mode in spent:
                    rates[shape, mode].append(n / spent[mode])
                if rnd == 1:
                    pairs = [(x, y) for bx, by in zip(got["serial"], got["concurrent"]) for x, y in zip(bx, by)]
                    assert len(pairs) == n and all(torch.equal(x[k], y[k]) for x, y in pairs for k in x), shape
                print(f"round {rnd} {shape}: " + "; ".join(
                    f"{mode} {rates[shape, mode][-1]:.2f} samples/s" for mode in ("serial", "concurrent")), flush=True)
        report = s.report()
    print(f"{n} samples ({len(batches)} batches of {a.batch}, up to 320 tokens) a measurement, {a.rounds} rounds; "
          f"extract.concurrency {a.concurrency}, train.loader_threads {a.threads}; captured {report['captured']}, "
          f"same samples and bytes serial vs concurrent: yes")
    for shape in shapes:
        ser, con = rates[shape, "serial"], rates[shape, "concurrent"]
        ratio = [c / r for c, r in zip(con, ser)]
        print(f"{shape}: serial worst {min(ser):.2f} samples/s, concurrent worst {min(con):.2f} samples/s; "
              f"concurrent/serial per round {', '.join(f'{x:.2f}x' for x in ratio)}, worst round {min(ratio):.2f}x")


if __name__ == "__main__":
    main()
