"""The trainer on shards captured by real SGLang: resume after kill -9, torchrun with 2 ranks (DDP and
FSDP2), refusals."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY_CONFIG, eaglebox_cli

pytestmark = pytest.mark.sglang  # the shards come from a real server

COMMON = ["train.batch_size=4", "train.max_length=320", "train.log_every=1", "train.ttt_length=3",
          "train.max_steps=8", "train.warmup_steps=2", "train.heldout_share=0"]


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_cmd(shards, out, *extra):
    return [sys.executable, "-m", "eaglebox.cli", "train", "--config", str(TINY_CONFIG),
            f"extract.output_dir={shards}", f"train.output_dir={out}", *COMMON, *extra]


def test_kill_9_then_resume_reproduces_the_uninterrupted_loss_curve(tiny_shards, tmp_path):
    ref = subprocess.run(train_cmd(tiny_shards, tmp_path / "ref", "train.checkpoint_every=3"), cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses(tmp_path / "ref")
    assert len(want) == 8 and want[-1] < want[0]
    # the run report names the TTT attention kernel (on a GPU: flex blocks chosen from its shared memory)
    assert json.loads((tmp_path / "ref" / "report.json").read_text())["attention"] == {"cpu": "eager dense reference"}

    cut = tmp_path / "cut"
    victim = subprocess.Popen(train_cmd(tiny_shards, cut, "train.checkpoint_every=3"), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not ((cut / "checkpoints" / "step-00000003").exists() and (cut / "metrics.jsonl").exists()
               and len((cut / "metrics.jsonl").read_text().splitlines()) >= 4):
        assert victim.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not (cut / "draft").exists()
    resumed = subprocess.run(train_cmd(tiny_shards, cut, "train.checkpoint_every=3"), cwd=ROOT,
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert losses(cut) == want  # exactly: CPU training is deterministic
    names = sorted(p.name for p in (cut / "checkpoints").iterdir())
    assert names == ["step-00000006", "step-00000008"]  # keep_checkpoints=2, no temporaries left
    assert (cut / "curves.png").stat().st_size > 10_000
    ref_draft = (tmp_path / "ref" / "draft" / "model.safetensors").read_bytes()
    assert (cut / "draft" / "model.safetensors").read_bytes() == ref_draft

    # `eaglebox export` rebuilds the same draft from the newest checkpoint
    (cut / "draft" / "model.safetensors").unlink()
    r = eaglebox_cli("export", "--config", str(TINY_CONFIG), f"extract.output_dir={tiny_shards}",
                     f"train.output_dir={cut}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (cut / "draft" / "model.safetensors").read_bytes() == ref_draft

    # resuming with another batch size, or on other shards, would train on another sample order
    r = subprocess.run(train_cmd(tiny_shards, cut, "train.batch_size=2", "train.max_steps=10"), cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "batch_size: checkpoint 4, now 2" in r.stderr + r.stdout
    other = tmp_path / "other-shards"
    shutil.copytree(tiny_shards, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["shards"] = manifest["shards"][:-1]
    (other / "manifest.json").write_text(json.dumps(manifest))
    r = subprocess.run(train_cmd(other, cut, "train.max_steps=10"), cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 1 and "shards: checkpoint '" in r.stderr + r.stdout, r.stderr[-3000:]


def test_torchrun_two_ranks_equal_one_rank_with_the_same_global_batch(tiny_shards, tmp_path):
    one = subprocess.run(train_cmd(tiny_shards, tmp_path / "one", "train.batch_size=4", "train.max_steps=4"),
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          *train_cmd(tiny_shards, tmp_path / "two", "train.batch_size=2", "train.max_steps=4")[1:]],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, rel=1e-4)

    # the same global batch on another world size is still another run: resuming it is refused
    more = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *train_cmd(tiny_shards, tmp_path / "one", "train.batch_size=2", "train.max_steps=6")[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert more.returncode != 0 and "was written by 1 ranks; resume with the same number" in more.stderr + more.stdout


def test_fsdp_two_ranks_resume_to_the_one_rank_curve(tiny_shards, tmp_path):
    """FSDP2 shards the draft across ranks; its checkpoints (full tensors) resume under FSDP2."""
    flat = ["train.min_lr_ratio=1.0"]  # LR constant after warm-up: a 2-step run resumed to 4 is the 4-step run
    one = subprocess.run(train_cmd(tiny_shards, tmp_path / "one", "train.batch_size=4", "train.max_steps=4", *flat),
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    for steps in (2, 4):
        two = subprocess.run([*torchrun, *train_cmd(tiny_shards, tmp_path / "fsdp", "train.batch_size=2",
                                                    f"train.max_steps={steps}", "train.parallel=fsdp", *flat)[1:]],
                             cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert two.returncode == 0, two.stderr[-3000:]
    assert "resumed from" in two.stdout + two.stderr
    a, b = losses(tmp_path / "one"), losses(tmp_path / "fsdp")
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, rel=1e-4)
    assert (tmp_path / "fsdp" / "draft" / "model.safetensors").exists()


def test_shards_of_another_capture_are_refused_naming_both_values(tiny_shards, tmp_path):
    r = eaglebox_cli("train", "--config", str(TINY_CONFIG), f"extract.output_dir={tiny_shards}",
                     f"train.output_dir={tmp_path / 'x'}", "model.dtype=float32")
    assert r.returncode == 1
    assert "shards have dtype='bfloat16', the config implies 'float32'" in r.stderr
    assert not (tmp_path / "x").exists()


def test_each_sample_records_the_whole_capture_spec(tiny_shards):
    """The capture server was given the spec (``EAGLEBOX_CAPTURE_HEADER``): every field is checked per sample."""
    from safetensors import safe_open

    manifest = json.loads((tiny_shards / "manifest.json").read_text())
    sample = tiny_shards / manifest["shards"][0]["samples"][0]["file"]
    with safe_open(str(sample), "pt") as f:
        assert json.loads(f.metadata()["header"]) == manifest["capture"]
