"""Online and hybrid training (issue 31, one host): the trainer captures each sample through a real SGLang
capture server as its loader needs it, over the server's own files. One test, three server starts (the
suite's time): an online run whose server is killed -9 (restarted by the trainer) and which is itself killed
-9, resumed as hybrid over a third epoch; its loss curve equals the offline run's on the same samples, and
the spool never holds more than the budget."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import GREEDY, ROOT, TINY_CONFIG, eaglebox_cli, free_port

pytestmark = pytest.mark.sglang

# tiny_shards' samples (64, greedy answers, 320 tokens at most): 8 steps an epoch at batch 8
SAMPLES = ["extract.max_samples=64", "extract.max_length=320", *GREEDY]
COMMON = ["train.batch_size=8", "train.max_length=320", "train.log_every=1", "train.ttt_length=3",
          "train.max_steps=24", "train.epochs=3", "train.warmup_steps=2", "train.heldout_share=0",
          "train.checkpoint_every=4"]


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_cmd(out, *extra):
    return [sys.executable, "-m", "eaglebox.cli", "train", "--config", str(TINY_CONFIG), f"train.output_dir={out}",
            *COMMON, *extra]


class HighWater(threading.Thread):
    """The largest number of bytes under ``folder`` (temporaries of the server's writers included),
    sampled every few milliseconds."""

    def __init__(self, folder):
        super().__init__(daemon=True)
        self.folder, self.peak, self.done = folder, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            total = 0
            for f in self.folder.rglob("*") if self.folder.exists() else ():
                try:
                    total += f.stat().st_size if f.is_file() else 0
                except FileNotFoundError:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.005)


def wait_for(cond, proc, what, timeout=600):
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def steps_logged(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_online_killed_on_both_sides_then_hybrid_trains_the_offline_curve_within_the_budget(tiny_shards, tmp_path):
    ref = subprocess.run(train_cmd(tmp_path / "offline", f"extract.output_dir={tiny_shards}"), cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses(tmp_path / "offline")
    assert len(want) == 24

    # the samples are extract's: the same data set, tokenization and (cached) regenerated answers
    extract_dir = tmp_path / "extract"
    extract_dir.mkdir()
    shutil.copy(tiny_shards / "regenerated.jsonl", extract_dir)
    out, spool = tmp_path / "online", tmp_path / "spool"
    # room for the 5 samples in flight (4 loader threads + 1: 1.98 MB at 320 tokens of the tiny target's
    # 4 x 128 features) and about 1 MB kept (a sample is 10-130 kB)
    budget = 3_000_000
    online = [f"extract.output_dir={extract_dir}", *SAMPLES, f"train.online.spool_dir={spool}",
              f"train.online.budget_bytes={budget}"]
    peak = HighWater(spool)
    peak.start()
    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as f:
        victim = subprocess.Popen(train_cmd(out, *online, "train.data=online", f"engine.port={free_port()}"),
                                  cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: steps_logged(out) >= 2, victim, "step 2")
        server = next(p for p in psutil.Process(victim.pid).children() if "sglang.launch_server" in p.cmdline())
        os.killpg(server.pid, signal.SIGKILL)  # the server and its scheduler; the trainer starts another
        wait_for(lambda: (out / "checkpoints" / "step-00000012").exists(), victim, "the checkpoint at step 12")
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait()
    log = log_path.read_text()
    assert "the capture server exited" in log and "restarting it (1 of 3)" in log, log[-3000:]
    assert not (out / "draft").exists()

    resumed = subprocess.run(train_cmd(out, *online, "train.data=hybrid", f"engine.port={free_port()}"), cwd=ROOT,
                             capture_output=True, text=True, timeout=900)
    peak.done.set()
    peak.join()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert losses(out) == want  # exactly: the features are deterministic, the order is the checkpoint's
    report = json.loads((out / "report.json").read_text())["data"]
    print(json.dumps({"spool_peak_bytes": peak.peak, "budget": budget, "report": report}))
    # hybrid kept what the budget allows from step 13 on and read it back in the third epoch
    assert report["data"] == "hybrid" and report["from_disk"] > 0 and report["captured"] > 0, report
    assert report["kept_samples"] < 64 and report["high_water_bytes"] <= budget, report
    assert 0 < peak.peak <= budget, peak.peak
    assert sorted(p.name for p in spool.iterdir()) == ["kept"]  # nothing in flight is left behind

    # the same draft as offline, but its provenance names the sample list; `eaglebox export` rebuilds it
    draft = (out / "draft" / "model.safetensors").read_bytes()
    assert draft == (tmp_path / "offline" / "draft" / "model.safetensors").read_bytes()
    ours, theirs = (json.loads((d / "draft" / "config.json").read_text())["eaglebox"] for d in (out, tmp_path / "offline"))
    assert ours["samples"] == theirs["samples"] == 64 and ours["shards_digest"] != theirs["shards_digest"]
    (out / "draft" / "model.safetensors").unlink()
    r = eaglebox_cli("export", "--config", str(TINY_CONFIG), f"train.output_dir={out}", "train.data=hybrid",
                     f"train.online.budget_bytes={budget}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "draft" / "model.safetensors").read_bytes() == draft
