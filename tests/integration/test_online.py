"""Online and hybrid training (issue 31, one host): the trainer captures each sample through a real SGLang
capture server as its loader needs it, over the server's own files. Seven server starts in all (the suite's
time): one started for ``train.online.url`` (``url_server``, shared with ``test_online_mooncake.py``), and
those of the trainer's own runs in the long test: an online run whose server is killed -9 (restarted by the trainer) and which is itself killed -9,
resumed as hybrid until its server is killed past ``train.online.restarts``, resumed again through the
module's server; its loss curve equals the offline run's on the same samples, and the spool never holds
more than the budget. Then two torchrun ranks: rank 0's server, killed -9 with the run, resumed through
the module's server, the two-rank offline curve; and two ranks online whose server alone is killed -9
(restarted by rank 0, waited for by rank 1), the same curve (the offline two-rank run made once for both).
The refusals of a server at ``train.online.url`` run against the module's server."""

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
from eaglebox.extract import ExtractError

pytestmark = pytest.mark.sglang

# tiny_shards' samples (64, greedy answers, 320 tokens at most): 8 steps an epoch at batch 8
SAMPLES = ["extract.max_samples=64", "extract.max_length=320", *GREEDY]
COMMON = ["train.batch_size=8", "train.max_length=320", "train.log_every=1", "train.ttt_length=3",
          "train.max_steps=24", "train.epochs=3", "train.warmup_steps=2", "train.heldout_share=0",
          "train.checkpoint_every=4"]


def extract_dir(tiny_shards, tmp_path):
    """The samples are extract's: the same data set, tokenization and (cached) regenerated answers."""
    d = tmp_path / "extract"
    d.mkdir()
    shutil.copy(tiny_shards / "regenerated.jsonl", d)
    return d


def kill_server(trainer):
    """kill -9 of the trainer's own capture server and its scheduler."""
    server = next(p for p in psutil.Process(trainer.pid).children() if "sglang.launch_server" in p.cmdline())
    os.killpg(server.pid, signal.SIGKILL)


def errors(output):
    return [line for line in output.splitlines() if line.startswith("eaglebox train:")]


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_cmd(out, *extra):
    return [sys.executable, "-m", "eaglebox.cli", "train", "--config", str(TINY_CONFIG), f"train.output_dir={out}",
            *COMMON, *extra]


def tree_bytes(folder) -> int:
    """Bytes of the files under ``folder`` (0 if it is gone); a file removed while it is read counts 0.
    ``os.scandir``, not ``Path.rglob`` + ``stat``: the same total for under half the CPU a pass, and the
    sampler below makes a pass every ~5 ms beside the trainer and its server on the suite's two cores
    (benchmarks/spool_scan.py, benchmarks/results/suite-speed-cpu-2026-12-07-s25.txt)."""
    total = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                total += tree_bytes(e.path)
            elif e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
    return total


class HighWater(threading.Thread):
    """The largest number of bytes under ``folder`` (temporaries of the server's writers included),
    sampled every few milliseconds."""

    def __init__(self, folder):
        super().__init__(daemon=True)
        self.folder, self.peak, self.done = folder, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, tree_bytes(self.folder))
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


def offline_losses(cmd: list[str], out, env=None) -> list[float]:
    """The reference: the same samples trained from the shards, 24 steps."""
    ref = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses(out)
    assert len(want) == 24
    return want


def test_online_killed_on_both_sides_then_hybrid_trains_the_offline_curve_within_the_budget(
        tiny_shards, offline_curve, url_server, tmp_path):
    offline, want = offline_curve

    url, spool, _ = url_server
    out = tmp_path / "online"
    # room for the 5 samples in flight (4 loader threads + 1: 1.98 MB at 320 tokens of the tiny target's
    # 4 x 128 features) and about 1 MB kept (a sample is 10-130 kB)
    budget = 3_000_000
    online = [f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}", *SAMPLES, f"train.online.spool_dir={spool}",
              f"train.online.budget_bytes={budget}"]
    peak = HighWater(spool)
    peak.start()
    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as f:
        victim = subprocess.Popen(train_cmd(out, *online, "train.data=online", f"engine.port={free_port()}"),
                                  cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: steps_logged(out) >= 2, victim, "step 2")
        kill_server(victim)  # the trainer starts another
        wait_for(lambda: (out / "checkpoints" / "step-00000012").exists(), victim, "the checkpoint at step 12")
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait()
    log = log_path.read_text()
    assert "the capture server exited" in log and "restarting it (1 of 3)" in log, log[-3000:]
    assert not (out / "draft").exists()

    # resumed as hybrid with no restarts left: its server killed -9 stops the run in one error, naming the key
    cut = subprocess.Popen(train_cmd(out, *online, "train.data=hybrid", f"engine.port={free_port()}",
                                     "train.online.restarts=0"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: steps_logged(out) >= 14, cut, "step 14")
        kill_server(cut)
        said = cut.communicate(timeout=300)[0]
    finally:
        cut.kill()
        cut.wait()
    assert cut.returncode == 1 and "Traceback" not in said, said[-3000:]
    (error,) = errors(said)
    assert ("the capture server exited and train.online.restarts=0 restarts are used up; cause: exit code -9"
            in error and str(out / "capture-server.log") in error), error
    assert not (out / "draft").exists() and sorted(p.name for p in spool.iterdir()) == ["kept"]

    # and again, through the server already running at train.online.url (the trainer starts none)
    resumed = subprocess.run(train_cmd(out, *online, "train.data=hybrid", f"train.online.url={url}"), cwd=ROOT,
                             capture_output=True, text=True, timeout=900)
    peak.done.set()
    peak.join()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr
    assert "resumed from" in said and "starting the capture server" not in said, said[-3000:]
    assert losses(out) == want  # exactly: the features are deterministic, the order is the checkpoint's
    report = json.loads((out / "report.json").read_text())["data"]
    print(json.dumps({"spool_peak_bytes": peak.peak, "budget": budget, "report": report}))
    # hybrid kept what the budget allows from step 13 on and read it back in the third epoch (this run's report)
    assert report["data"] == "hybrid" and report["from_disk"] > 0 and report["captured"] > 0, report
    assert report["kept_samples"] < 64 and report["high_water_bytes"] <= budget, report
    assert 0 < peak.peak <= budget, peak.peak
    assert sorted(p.name for p in spool.iterdir()) == ["kept"]  # nothing in flight is left behind

    # the same draft as offline, but its provenance names the sample list; `eaglebox export` rebuilds it
    draft = (out / "draft" / "model.safetensors").read_bytes()
    assert draft == (offline / "draft" / "model.safetensors").read_bytes()
    ours, theirs = (json.loads((d / "draft" / "config.json").read_text())["eaglebox"] for d in (out, offline))
    assert ours["samples"] == theirs["samples"] == 64 and ours["shards_digest"] != theirs["shards_digest"]
    (out / "draft" / "model.safetensors").unlink()
    r = eaglebox_cli("export", "--config", str(TINY_CONFIG), f"train.output_dir={out}", "train.data=hybrid",
                     f"train.online.budget_bytes={budget}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "draft" / "model.safetensors").read_bytes() == draft


def url_run(tiny_shards, url_server, tmp_path, *extra):
    url, spool, _ = url_server
    return subprocess.run(train_cmd(tmp_path / "train", f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}",
                                    *SAMPLES, "train.data=online", f"train.online.url={url}",
                                    f"train.online.spool_dir={spool}", *extra),
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def other_target(tmp_path):
    """The tiny target with its config.json written out again (same values, other bytes): another revision."""
    from conftest import TINY

    d = tmp_path / "target"
    shutil.copytree(TINY / "target", d)
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()), indent=1))
    return d


@pytest.mark.parametrize("differs", ["engine", "target"])
def test_a_server_at_train_online_url_launched_for_another_spec_is_refused_before_the_run_writes(
        tiny_shards, url_server, tmp_path, differs):
    """The server at train.online.url records the spec it was launched for in each sample: a trainer whose
    config implies another engine option (model.dtype) or another target is refused at the first sample,
    before it writes anything, in one error naming the key, the sample file and the difference."""
    url, spool, _ = url_server
    extra, diff = {"engine": ("model.dtype=float32", "dtype"),
                   "target": (f"model.path={other_target(tmp_path)}", "config_sha256")}[differs]
    r = url_run(tiny_shards, url_server, tmp_path, extra)
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in said, said[-3000:]
    (error,) = errors(said)
    print(error)
    assert error.startswith(f"eaglebox train: train.online.url={url}: {spool}/") and diff in error, error
    assert "the server reports" in error and "was launched for another spec" in error, error
    assert not (tmp_path / "train").exists() and list(spool.glob("*.safetensors")) == []


def test_a_sample_file_with_other_ids_than_were_sent_is_refused_naming_it(tiny_shards, url_server, tmp_path):
    """Another client of the same server and spool wrote other ids under a sample's name (its writer then
    paused, so the sample's own file cannot replace that one before the check): the trainer's read of that
    sample is refused naming the file and the line, and nothing of it stays in the spool."""
    import requests

    from eaglebox.config import load_config
    from eaglebox.extract.online import online_samples
    from eaglebox.shards.requests import capture_rid
    from eaglebox.shards.spec import capture_spec

    url, spool, pid = url_server
    cfg = load_config(TINY_CONFIG, [f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}", *SAMPLES,
                                    f"train.output_dir={tmp_path / 'train'}", "train.data=online",
                                    f"train.online.url={url}", f"train.online.spool_dir={spool}"])
    with online_samples(cfg, capture_spec(cfg), log=lambda *a: None) as samples:
        p, path = samples.planned(1), spool / f"{samples.planned(1).id}.safetensors"
        body = {"input_ids": p.input_ids[::-1], "rid": capture_rid(p.id), "return_hidden_states": True,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        assert requests.post(url + "/generate", json=body, timeout=300).status_code == 200
        deadline = time.monotonic() + 60
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} was not written"
            time.sleep(0.01)
        writer = next(q for q in psutil.Process(pid).children(recursive=True)
                      if "eaglebox.capture.writer" in " ".join(q.cmdline()))
        writer.suspend()
        try:
            with pytest.raises(ExtractError, match=rf"^{path}: the server ran other token ids than were sent for "
                                                   rf"line {p.line}$"):
                samples.get(1)
            assert list(spool.glob("*.safetensors")) == []
        finally:
            writer.resume()
        deadline = time.monotonic() + 60
        while not path.exists():  # the sample's own file, written once the writer runs again
            assert time.monotonic() < deadline, f"{path} was not written"
            time.sleep(0.01)
    assert list(spool.iterdir()) == []


RANKS = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
PER_RANK = ["train.batch_size=4", "train.loader_threads=2"]  # global batch 8: 8 steps an epoch, as above


def ranks_env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def ranks_cmd(out, *extra):
    """``eaglebox train`` under torchrun, two ranks (gloo), each with half of the one-rank batch."""
    return [*RANKS, *train_cmd(out, *PER_RANK, *extra)[1:]]


@pytest.fixture(scope="module")
def two_rank_offline(tiny_shards, tmp_path_factory):
    """The two-rank reference, once for the module: two ranks trained offline on the same samples, 24 steps."""
    out = tmp_path_factory.mktemp("two-ranks") / "offline"
    return offline_losses(ranks_cmd(out, f"extract.output_dir={tiny_shards}"), out, ranks_env())


def kill_job(proc):
    """kill -9 of a torchrun job: the launcher, its ranks (each in a session of its own) and their children."""
    try:
        job = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in job:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(job, timeout=60)


def test_two_ranks_share_one_server_and_train_the_offline_two_rank_curve_within_the_budget(
        tiny_shards, url_server, two_rank_offline, tmp_path):
    """Two torchrun ranks (gloo), hybrid: rank 0 starts the capture server both ranks use, the run is killed -9
    (launcher, ranks and that server) after its checkpoint at step 4 and resumed through the server at
    train.online.url. Each rank captures its own slice of each batch into its own folder; the losses are
    exactly those of two ranks offline on the same samples, and the whole spool stays under the budget."""
    env, cmd, want = ranks_env(), ranks_cmd, two_rank_offline
    url, spool, _ = url_server
    out = tmp_path / "hybrid"
    # each rank has half: room for its 5 samples in flight (1.98 MB) and about 1 MB kept
    budget = 6_000_000
    hybrid = [f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}", *SAMPLES, "train.data=hybrid",
              f"train.online.spool_dir={spool}", f"train.online.budget_bytes={budget}"]
    peak = HighWater(spool)
    peak.start()
    with open(tmp_path / "killed.log", "w") as f:
        victim = subprocess.Popen(cmd(out, *hybrid, f"engine.port={free_port()}"), cwd=ROOT, env=env, stdout=f,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: steps_logged(out) >= 1, victim, "step 1")
        job = [psutil.Process(victim.pid), *psutil.Process(victim.pid).children(recursive=True)]
        assert sum("sglang.launch_server" in p.cmdline() for p in job) == 1  # rank 0's, none of rank 1
        # early: the 24 steps take a few seconds once the server is up
        wait_for(lambda: (out / "checkpoints" / "step-00000004").exists(), victim, "the checkpoint at step 4")
        for p in job:  # torchrun starts each rank in a session of its own: kill -9 of every process
            p.kill()
        psutil.wait_procs(job, timeout=60)
    finally:
        victim.kill()
        victim.wait()
    assert not (out / "draft").exists()

    resumed = subprocess.run(cmd(out, *hybrid, f"train.online.url={url}"), cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)
    peak.done.set()
    peak.join()
    said = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, said[-3000:]
    assert "resumed from" in said and "starting the capture server" not in said, said[-3000:]
    assert losses(out) == want  # exactly: the same samples on the same ranks in the same order
    report = json.loads((out / "report.json").read_text())["data"]  # rank 0's
    print(json.dumps({"spool_peak_bytes": peak.peak, "budget": budget, "report": report}))
    assert report["spool"] == str(spool / "rank0") and report["captured"] > 0, report
    assert report["high_water_bytes"] <= budget // 2, report
    assert 0 < peak.peak <= budget, peak.peak
    # each rank's files in its own folder, nothing in flight left behind; hybrid's kept samples stay
    assert sorted(p.relative_to(spool).as_posix() for p in spool.iterdir()) == ["rank0", "rank1"]
    for d in spool.iterdir():
        assert [p.name for p in d.iterdir()] == ["kept"] and any((d / "kept").iterdir()), d
        shutil.rmtree(d)  # the module's server's spool, as the other tests expect it


def test_two_ranks_send_their_samples_in_flight_again_when_rank_0_restarts_the_killed_server(
        tiny_shards, two_rank_offline, tmp_path):
    """Two torchrun ranks online, rank 0's capture server killed -9 alone mid-epoch (the trainer lives on):
    rank 0 restarts it; rank 1, which did not start it, sees its port close, waits for it to listen again
    and sends its samples in flight again. The run ends with exactly the two-rank offline losses."""
    out = tmp_path / "online"
    # the client's retries (0.1 + 0.2 + ... + 1.6 s) end long before the restarted server listens (~25 s
    # here, minutes for a large target): rank 1's samples in flight get through only if it waits for it
    online = [f"extract.output_dir={extract_dir(tiny_shards, tmp_path)}", *SAMPLES, "train.data=online",
              "extract.retry_backoff_s=0.1", f"engine.port={free_port()}"]
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as f:
        run = subprocess.Popen(ranks_cmd(out, *online), cwd=ROOT, env=ranks_env(), stdout=f,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: steps_logged(out) >= 2, run, "step 2")
        (server,) = [p for p in psutil.Process(run.pid).children(recursive=True)
                     if "sglang.launch_server" in p.cmdline()]
        os.killpg(server.pid, signal.SIGKILL)  # the server and its scheduler, mid-epoch (8 steps an epoch)
        run.wait(timeout=900)
    finally:
        kill_job(run)
        run.wait()
    log = log_path.read_text()
    assert run.returncode == 0 and "Traceback" not in log, log[-4000:]
    assert "the capture server exited" in log and "restarting it (1 of 3)" in log, log[-4000:]
    assert "train: rank1: the capture server at http://" in log, log[-4000:]  # rank 1 saw it go and come back
    assert losses(out) == two_rank_offline  # exactly: the same samples on the same ranks in the same order
    assert json.loads((out / "report.json").read_text())["data"]["server_restarts"] == 1  # rank 0's
    assert sorted(p.name for p in (out / "spool").iterdir()) == ["rank0", "rank1"]
    assert not any((out / "spool").rglob("*.safetensors"))  # nothing in flight left behind
