"""The online reader without a server (issue 31): a stand-in client writes each sample as the capture sink
does (:func:`eaglebox.capture.sink.write_sample`, deterministic features), so the byte budget, hybrid's
kept samples, the spool's cleaning and the server restarts are checked in a second; the real server runs in
``tests/integration/test_online.py``."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import small_spec
from eaglebox.capture.sink import write_sample
from eaglebox.extract import ExtractError
from eaglebox.extract.online import KEPT, OnlineSamples, clean_spool, in_flight_reserve
from eaglebox.extract.plan import Planned, sample_id
from eaglebox.shards.format import samples_digest
from eaglebox.shards.requests import sample_id_from_rid


class Server:
    """Stands in for :class:`~eaglebox.engine.server.SGLangServer`: ``kill`` is kill -9."""

    def __init__(self, tmp_path: Path):
        self.up, self.starts, self.log_path, self.proc = True, 0, tmp_path / "server.log", None
        self.lock = threading.Lock()
        self.log_path.write_text("")

    def alive(self) -> bool:
        return self.up

    def stop(self) -> None:
        with self.lock:  # a killed server writes nothing more
            self.up = False

    def start(self) -> None:
        self.up, self.starts = True, self.starts + 1


class Client:
    """Answers ``/generate`` as the capture server does: the sample's file, then rows == prompt tokens."""

    def __init__(self, spool: Path, spec, server: Server, kill_at: set[int] = frozenset()):
        self.spool, self.spec, self.server, self.kill_at, self.calls = spool, spec, server, kill_at, 0

    def post(self, path: str, body: dict) -> dict:
        self.calls += 1
        if self.calls in self.kill_at:
            self.server.up = False
        if not self.server.alive():
            raise ExtractError("the SGLang server at http://stand-in has exited")
        ids, sid = body["input_ids"], sample_id_from_rid(body["rid"])
        g = torch.Generator().manual_seed(int(hashlib.sha256(sid.encode()).hexdigest()[:8], 16))
        aux, last = torch.randn(len(ids), 12, generator=g), torch.randn(len(ids), 4, generator=g)
        with self.server.lock:
            if not self.server.alive():
                raise ExtractError("the SGLang server at http://stand-in has exited")
            write_sample(self.spool / f"{sid}.safetensors", ids, [aux.bfloat16()], [last.bfloat16()],
                         self.spec.sample_header())
        return {"meta_info": {"prompt_tokens": len(ids), "hidden_states": [{"rows": len(ids)}]}}


def planned(spec, n=12, length=40) -> list[Planned]:
    out = []
    for i in range(n):
        ids = [(7 * i + j) % 50 + 1 for j in range(length - i)]
        out.append(Planned(sample_id(ids, spec), i + 1, ids, [0] * 5 + [1] * (len(ids) - 5)))
    return out


def reader(tmp_path, plan, *, budget=None, threads=3, restarts=0, kill_at=()):
    spec, spool = small_spec(), tmp_path / "spool"
    clean_spool(spool, keep=budget is not None)
    server = Server(tmp_path)
    reserve = in_flight_reserve(40, spec, threads)
    samples = OnlineSamples(plan, spec, Client(spool, spec, server, set(kill_at)), spool, None, budget=budget,
                            reserve=reserve, server=server, keeper=ThreadPoolExecutor(1), restarts=restarts,
                            log=lambda *_: None)
    return samples, server, spool, reserve


def read_all(samples, threads=3):
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: samples.get(i), range(len(samples))))


def test_hybrid_keeps_within_the_budget_and_reads_the_same_features_back(tmp_path):
    plan = planned(small_spec())
    size = 40 * (4 * 4 * 2 + 8) + 2000  # the longest sample's file, roughly
    samples, _, spool, reserve = reader(tmp_path, plan, budget=in_flight_reserve(40, small_spec(), 3) + 4 * size)
    first, again = read_all(samples), read_all(samples)
    for a, b in zip(first, again):
        assert all(torch.equal(a[k], b[k]) for k in a)
    r = samples.report()
    assert r["data"] == "hybrid" and 0 < r["kept_samples"] < len(plan) and r["from_disk"] == r["kept_samples"]
    assert r["captured"] == 2 * len(plan) - r["kept_samples"]
    assert r["high_water_bytes"] <= samples.budget and r["kept_bytes"] + reserve <= samples.budget
    assert sorted(p.name for p in spool.iterdir()) == [KEPT]  # nothing in flight left
    # a new reader of the same samples (a resumed run after kill -9) drops what was in flight or half written
    # and reuses what was kept, verified on read
    (spool / "0123.safetensors").write_bytes(b"in flight")
    (spool / ".0123.safetensors.7-7.tmp").write_bytes(b"half")
    again, _, _, _ = reader(tmp_path, plan, budget=samples.budget)
    assert sorted(p.name for p in spool.iterdir()) == [KEPT]
    assert again.report()["kept_samples"] == r["kept_samples"]
    read_all(again)
    assert again.report()["from_disk"] == r["kept_samples"]
    # online keeps nothing and clears hybrid's samples
    online, _, spool, _ = reader(tmp_path, plan)
    assert not (spool / KEPT).exists()
    read_all(online)
    assert online.report()["kept_samples"] == 0 and list(spool.iterdir()) == []


def test_ids_masks_and_digest_come_from_the_plan_alone(tmp_path):
    spec, plan = small_spec(), planned(small_spec())
    samples, *_ = reader(tmp_path, plan)
    ids, mask = samples.ids_and_mask(3)
    assert ids.tolist() == plan[3].input_ids and mask.tolist() == plan[3].loss_mask
    assert samples.digest() == samples_digest(spec, [(p.id, p.loss_mask) for p in plan])
    other = [*plan[:3], Planned(plan[3].id, 4, plan[3].input_ids, [1] * len(plan[3].input_ids)), *plan[4:]]
    assert samples_digest(spec, [(p.id, p.loss_mask) for p in other]) != samples.digest()  # a mask changes it
    assert samples.get(3, max_rows=10)["aux"].shape == (10, 12)


def test_a_killed_server_is_restarted_once_for_all_threads_or_named_in_one_error(tmp_path):
    plan = planned(small_spec())
    samples, server, spool, _ = reader(tmp_path, plan, restarts=2, kill_at={3, 7})
    read_all(samples)
    assert server.starts == 2 and samples.report()["server_restarts"] == 2
    assert list(spool.iterdir()) == []
    samples, server, *_ = reader(tmp_path / "b", plan, restarts=0, kill_at={2})
    with pytest.raises(ExtractError, match=r"the capture server exited and train.online.restarts=0 restarts are "
                                           r"used up; cause: its log's last error: no cause in its log \(log: .*server.log\)"):
        read_all(samples)


def test_a_wrong_answer_from_a_live_server_stops_the_run_without_a_restart(tmp_path):
    samples, server, *_ = reader(tmp_path, planned(small_spec()), restarts=3)
    post = samples.client.post
    samples.client.post = lambda path, body: post(path, body) | {"meta_info": {"prompt_tokens": 1}}
    with pytest.raises(ExtractError, match=r"sample at line 1: server saw 1 prompt tokens, sent 40"):
        samples.get(0)
    assert server.starts == 0


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
                                           r"5 \(train.loader_threads \+ 1\) of up to 2048 tokens \(extract.max_length\) "
                                           r"are 10,905,600 bytes"):
        with online_samples(cfg, capture_spec(cfg)):
            pass
    assert not (tmp_path / "train").exists()
