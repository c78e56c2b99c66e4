"""The online reader's parts that need no server (issue 31): what it takes from the plan alone, the spool's
cleaning after a kill -9, and the config refusals made before a server starts. The reader against a real
SGLang server (captures, budget, kept samples, server kill -9 and restart, trainer kill -9) is
``tests/integration/test_online.py``."""

from __future__ import annotations

import pytest

from conftest import small_spec
from eaglebox.extract import ExtractError
from eaglebox.extract.online import KEPT, Listening, OnlineSamples, clean_other_ranks, clean_spool
from eaglebox.extract.plan import Planned, sample_id
from eaglebox.shards.format import samples_digest


def planned(spec, n=12, length=40) -> list[Planned]:
    out = []
    for i in range(n):
        ids = [(7 * i + j) % 50 + 1 for j in range(length - i)]
        out.append(Planned(sample_id(ids, spec), i + 1, ids, [0] * 5 + [1] * (len(ids) - 5)))
    return out


def test_ids_masks_and_digest_come_from_the_plan_alone(tmp_path):
    spec, plan = small_spec(), planned(small_spec())
    samples = OnlineSamples(plan, spec, None, tmp_path / "spool", None, budget=None, reserve=0)
    assert len(samples) == len(plan)
    ids, mask = samples.ids_and_mask(3)
    assert ids.tolist() == plan[3].input_ids and mask.tolist() == plan[3].loss_mask
    assert samples.digest() == samples_digest(spec, [(p.id, p.loss_mask) for p in plan])
    other = [*plan[:3], Planned(plan[3].id, 4, plan[3].input_ids, [1] * len(plan[3].input_ids)), *plan[4:]]
    assert samples_digest(spec, [(p.id, p.loss_mask) for p in other]) != samples.digest()  # a mask changes it


def test_a_restarted_run_drops_samples_in_flight_and_half_written_files_and_online_drops_kept_ones(tmp_path):
    spool = tmp_path / "spool"
    clean_spool(spool, keep=True)
    (spool / KEPT / "0001.safetensors").write_bytes(b"kept")
    (spool / "0123.safetensors").write_bytes(b"in flight")
    (spool / ".0123.safetensors.7-7.tmp").write_bytes(b"half")
    clean_spool(spool, keep=True)
    assert sorted(p.relative_to(spool).as_posix() for p in spool.rglob("*")) == [KEPT, f"{KEPT}/0001.safetensors"]
    clean_spool(spool, keep=False)
    assert list(spool.iterdir()) == []


def test_rank_0_drops_what_a_run_at_another_world_size_left_so_the_budget_holds_for_the_whole_spool(tmp_path):
    spool = tmp_path / "spool"
    for d in ("rank0", "rank1", "rank2"):
        clean_spool(spool / d, keep=True)
        (spool / d / KEPT / "0001.safetensors").write_bytes(b"kept")
    clean_spool(spool, keep=True)
    (spool / KEPT / "0002.safetensors").write_bytes(b"kept by one rank")
    (spool / "0003.safetensors").write_bytes(b"in flight")
    clean_other_ranks(spool, 2)
    assert sorted(p.relative_to(spool).as_posix() for p in spool.rglob("*.safetensors")) == [
        f"rank0/{KEPT}/0001.safetensors", f"rank1/{KEPT}/0001.safetensors"]
    clean_other_ranks(spool, 1)  # one rank's files are at the top; its own are cleaned by clean_spool
    assert list(spool.iterdir()) == []


def test_hybrid_without_a_budget_and_a_budget_below_the_samples_in_flight_are_refused_before_a_server(
        tiny_target, tmp_path):
    from conftest import config_for_model
    from eaglebox.config.load import ConfigError
    from eaglebox.extract.online import online_samples
    from eaglebox.shards.spec import capture_spec

    base = ["capture.layer_ids=[0, 1, 2]", "engine.device=cpu", "engine.max_total_tokens=1024",
            f"extract.dataset={tmp_path / 'none.jsonl'}", f"train.output_dir={tmp_path / 'train'}"]
    with pytest.raises(ConfigError, match=r"train.data: hybrid keeps samples on disk up to train.online.budget_bytes"):
        config_for_model(tmp_path, tiny_target, *base, "train.data=hybrid")
    cfg = config_for_model(tmp_path, tiny_target, *base, "train.data=hybrid", "train.online.budget_bytes=1000000",
                           "extract.max_length=2048")
    with pytest.raises(ExtractError, match=r"train.online.budget_bytes=1,000,000 cannot hold the samples in flight: "
                                           r"5 \(extract.concurrency, at most train.loader_threads x train.batch_size, \+ 1\) "
                                           r"of up to 2048 tokens \(extract.max_length\) "
                                           r"are 10,905,600 bytes"):
        with online_samples(cfg, capture_spec(cfg)):
            pass
    # under torchrun each rank has its share of the budget: 2 ranks of 20 MB cannot hold 10.9 MB each
    cfg = config_for_model(tmp_path, tiny_target, *base, "train.data=hybrid", "train.online.budget_bytes=20000000",
                           "extract.max_length=2048")
    with pytest.raises(ExtractError, match=r"train.online.budget_bytes=20,000,000 cannot hold the samples in flight: "
                                           r".* are 10,905,600 bytes a rank, and each of the 2 ranks has 1/2 of the "
                                           r"budget, 10,000,000$"):
        with online_samples(cfg, capture_spec(cfg), rank=0, world=2):
            pass
    assert not (tmp_path / "train").exists()


def test_another_rank_tells_its_own_failures_from_rank_0s_server_gone_and_names_the_url_when_it_stays_gone(tmp_path):
    """A rank that did not start the server watches its port: a failure while it listens is the attempt's
    own (raised as it is); once it closed, the rank waits ``wait_s`` for it to answer again, then stops
    naming the url and the wait. (The restart itself: tests/integration/test_online.py.)"""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    watch, said = Listening(url, every_s=0), []
    samples = OnlineSamples(planned(small_spec()), small_spec(), None, tmp_path / "spool", None, budget=None,
                            reserve=0, rank_dir="rank1", shared=watch, wait_s=1, log=said.append)
    own = ExtractError("sample at line 1: HTTP 400")
    assert watch() and watch.closed == 0
    with pytest.raises(ExtractError) as raised:
        samples._await_restart(0, own)
    assert raised.value is own and said == []
    listener.close()
    assert not watch() and watch.closed == 1
    with pytest.raises(ExtractError, match=rf"^the capture server at {url}, started by rank 0, stopped listening and "
                                           r"did not answer again within 1 s \(engine.startup_timeout_s\)"):
        samples._await_restart(0, own)
    assert said and said[0].startswith(f"train: rank1: the capture server at {url} stopped listening"), said
