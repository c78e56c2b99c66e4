import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors import safe_open

from eaglebox.capture.sink import SHARED_BYTES, CaptureSink, write_sample
from eaglebox.shards.format import tensor_sha256
from eaglebox.shards.requests import sample_id_from_rid


def test_rid_parsing():
    assert sample_id_from_rid("eaglebox-abc123-9f00") == "abc123"
    assert sample_id_from_rid("eaglebox-abc") is None
    assert sample_id_from_rid("user-request") is None
    assert sample_id_from_rid(None) is None


@pytest.fixture
def new_sink():
    """CaptureSink(...), each closed at the end of the test: its writer process is gone."""
    made = []

    def make(*args, **kw):
        made.append(CaptureSink(*args, **kw))
        return made[-1]
    yield make
    for sink in made:
        sink.close()
        assert not alive(sink.writer_pid)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between the open and the read
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_interleaved_chunks_of_two_requests_are_assembled_in_order(tmp_path, new_sink):
    sink = new_sink(tmp_path, header={"engine": "sglang"})
    a_aux, a_last = torch.randn(5, 6).bfloat16(), torch.randn(5, 2).bfloat16()
    b_aux, b_last = torch.randn(3, 6).bfloat16(), torch.randn(3, 2).bfloat16()
    assert sink.add_chunk("ra", "a", [1, 2, 3, 4, 5], a_aux[:2], a_last[:2]) is None
    assert sink.add_chunk("rb", "b", [7, 8, 9], b_aux[:1], b_last[:1]) is None
    assert sink.add_chunk("ra", "a", [1, 2, 3, 4, 5], a_aux[2:4], a_last[2:4]) is None
    meta_b = sink.add_chunk("rb", "b", [7, 8, 9], b_aux[1:], b_last[1:])
    meta_a = sink.add_chunk("ra", "a", [1, 2, 3, 4, 5], a_aux[4:], a_last[4:])
    sink.flush()
    assert meta_a.pop("sink")["samples"] <= 1 and sink.stats["samples"] == 2  # the sink's numbers, for the client
    assert meta_a == {"file": str(tmp_path / "a.safetensors"), "rows": 5, "dtype": "bfloat16",
                      "aux_shape": [5, 6], "last_shape": [5, 2], "engine": "sglang"}
    assert meta_b["rows"] == 3
    for sid, ids, aux, last in (("a", [1, 2, 3, 4, 5], a_aux, a_last), ("b", [7, 8, 9], b_aux, b_last)):
        assert_sample(tmp_path / f"{sid}.safetensors", ids, aux, last)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors"]
    assert sink.held_bytes == 0
    assert sink._w.regions.free == [(0, SHARED_BYTES)]  # every region given back, coalesced


def test_files_are_byte_identical_to_write_sample_of_the_chunks(tmp_path, new_sink):
    """The writer process writes what write_sample writes from the chunks themselves (the format every
    reader and every old shard has): same bytes, same sha256 and max_abs metadata."""
    sink = new_sink(tmp_path / "sink", header={"engine": "sglang", "captured_layer_inputs": [1, 2]})
    for dtype in (torch.bfloat16, torch.float32):
        ids = list(range(7))
        aux, last = (torch.randn(7, 2 * 16) * 3).to(dtype), torch.randn(7, 16).to(dtype)
        aux[3, 20] = float("inf")
        for lo, hi in ((0, 3), (3, 4), (4, 7)):
            meta = sink.add_chunk(f"r-{dtype}", f"s-{dtype}", ids, aux[lo:hi], last[lo:hi])
        sink.flush()
        ref = tmp_path / f"ref-{dtype}.safetensors"
        write_sample(ref, ids, [aux[:3], aux[3:4], aux[4:]], [last[:3], last[3:4], last[4:]],
                     {"engine": "sglang", "captured_layer_inputs": [1, 2]})
        assert (tmp_path / "sink" / f"s-{dtype}.safetensors").read_bytes() == ref.read_bytes()
        assert meta["dtype"] == str(dtype).removeprefix("torch.")


def assert_sample(path, ids, aux, last):
    with safe_open(str(path), "pt") as f:
        got = {k: f.get_tensor(k) for k in ("input_ids", "aux", "last")}
        assert f.metadata()["sha256"] == tensor_sha256(got)
    assert got["input_ids"].tolist() == ids
    assert torch.equal(got["aux"], aux) and torch.equal(got["last"], last)


def test_two_requests_for_one_sample_never_merge(tmp_path, new_sink):
    """A retry or duplicate (same sample, another nonce) in the middle of a chunked prefill is a request
    of its own: keyed by sample id, the second request's chunks would be appended to the first's."""
    sink = new_sink(tmp_path)
    aux, last = torch.randn(4, 6), torch.randn(4, 2)
    for lo, hi in ((0, 2), (2, 4)):
        for rid in ("eaglebox-s-1", "eaglebox-s-2"):
            meta = sink.add_chunk(rid, "s", [5, 6, 7, 8], aux[lo:hi], last[lo:hi])
    assert meta["rows"] == 4
    sink.flush()
    assert_sample(tmp_path / "s.safetensors", [5, 6, 7, 8], aux, last)
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]


def test_rows_beyond_the_prompt_are_an_error_and_drop_forgets(tmp_path, new_sink):
    sink = new_sink(tmp_path)
    with pytest.raises(RuntimeError, match="4 rows for a 3-token prompt"):
        sink.add_chunk("rx", "x", [1, 2, 3], torch.zeros(4, 2), torch.zeros(4, 1))
    sink.add_chunk("ry", "y", [1, 2, 3], torch.zeros(2, 2), torch.zeros(2, 1))
    sink.drop("ry")  # retracted: its rows will be recomputed from the start
    assert sink.held_bytes == 0
    assert sink.add_chunk("ry", "y", [1, 2, 3], torch.zeros(3, 2), torch.zeros(3, 1))["rows"] == 3
    with pytest.raises(RuntimeError, match="a chunk of torch.float16"):  # a chunk unlike the request's first
        sink.add_chunk("rw", "w", [1, 2], torch.zeros(1, 2), torch.zeros(1, 1))
        sink.add_chunk("rw", "w", [1, 2], torch.zeros(1, 2).half(), torch.zeros(1, 1).half())
    sink.flush()
    assert sink.held_bytes == 0 and sink._w.regions.free == [(0, SHARED_BYTES)]


def test_rows_of_a_request_that_goes_away_are_freed(tmp_path, new_sink):
    """An aborted request never reaches the hook again; its rows go when SGLang drops its Req."""
    class Req:  # what the hook passes as owner: any object SGLang lets go of
        pass

    sink = new_sink(tmp_path)
    req = Req()
    sink.add_chunk("r1", "a", [1, 2, 3, 4], torch.zeros(2, 2), torch.zeros(2, 1), owner=req)
    assert sink.held_bytes == 2 * 2 * 4 + 2 * 1 * 4
    del req
    sink.add_chunk("r2", "b", [1, 2], torch.zeros(1, 2), torch.zeros(1, 1))
    assert sink.held_bytes == 2 * 4 + 4  # r1 forgotten, r2's first chunk held
    sink.flush()


def test_the_scheduler_waits_while_held_bytes_exceed_the_budget(tmp_path, new_sink):
    """With the writer process stopped, a completed sample over the budget blocks add_chunk until the
    writer frees it; under the budget, add_chunk returns at once."""
    sink = new_sink(tmp_path, buffer_bytes=100)
    os.kill(sink.writer_pid, signal.SIGSTOP)
    try:
        assert sink.add_chunk("r1", "small", [1], torch.zeros(1, 4), torch.zeros(1, 1))["rows"] == 1  # 20 bytes
        returned = threading.Event()
        t = threading.Thread(target=lambda: (sink.add_chunk("r2", "big", [1, 2, 3], torch.zeros(3, 8),
                                                            torch.zeros(3, 2)), returned.set()))
        t.start()
        assert not returned.wait(0.5)  # 20 + 120 bytes held > 100, two samples queued, the writer stopped
    finally:
        os.kill(sink.writer_pid, signal.SIGCONT)
    assert returned.wait(30)
    sink.flush()
    assert sink.held_bytes == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors",
                                                                                  "small.safetensors"]


def test_writer_failure_surfaces_on_the_next_call_and_at_once(tmp_path, new_sink):
    """Raised by the next call, and passed at once to on_error (the hook stops the server with it): the
    last request may have been answered already, leaving no next call."""
    reported = []
    sink = new_sink(tmp_path / "d", on_error=reported.append)
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("not a directory")
    sink.add_chunk("rz", "z", [1], torch.zeros(1, 2), torch.zeros(1, 1))
    deadline = time.monotonic() + 30
    while not reported and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reported == ["eaglebox capture writer failed: NotADirectoryError(20, 'Not a directory')"]
    with pytest.raises(RuntimeError, match=r"capture writer failed: NotADirectoryError\(20, 'Not a directory'\)"):
        sink.flush()


def test_a_writer_process_that_dies_surfaces_on_the_next_call(tmp_path, new_sink):
    sink = new_sink(tmp_path)
    os.kill(sink.writer_pid, signal.SIGKILL)
    assert gone_within(sink.writer_pid, 10)
    with pytest.raises(RuntimeError, match=f"writer process \\(pid {sink.writer_pid}\\) exited with code -9"):
        sink.add_chunk("r", "x", [1], torch.zeros(1, 2), torch.zeros(1, 1))


def test_the_writer_process_ends_with_the_sink_and_dies_with_the_scheduler(tmp_path, new_sink):
    """Closed or collected, the sink's writer process writes what it was sent and exits; a scheduler
    killed with -9 takes it along (no orphan left writing or holding the shared memory)."""
    sink = new_sink(tmp_path / "closed")
    sink.add_chunk("r", "a", [1, 2], torch.ones(2, 2), torch.ones(2, 1))
    sink.close()
    assert not alive(sink.writer_pid) and (tmp_path / "closed" / "a.safetensors").exists()

    dropped = CaptureSink(tmp_path / "dropped")
    pid = dropped.writer_pid
    del dropped
    gc.collect()
    assert gone_within(pid, 30)

    code = ("import sys, torch; from eaglebox.capture.sink import CaptureSink; s = CaptureSink(sys.argv[1]); "
            "print(s.writer_pid, flush=True); import time; time.sleep(600)")
    scheduler = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "killed")], stdout=subprocess.PIPE,
                                 text=True)
    try:
        pid = int(scheduler.stdout.readline())
        assert alive(pid)
        scheduler.kill()
        scheduler.wait()
        assert gone_within(pid, 10)
    finally:
        scheduler.kill()
        scheduler.wait()


def test_sha_depends_on_every_byte():
    t = {"a": torch.zeros(4, dtype=torch.bfloat16)}
    u = {"a": torch.zeros(4, dtype=torch.bfloat16)}
    u["a"][3] = 1
    assert tensor_sha256(t) != tensor_sha256(u)


def test_streamed_safetensors_read_back_by_safetensors_and_hash_the_file(tmp_path):
    import hashlib

    from safetensors.torch import load_file

    from eaglebox.shards.format import write_safetensors

    parts = {"aux": [torch.randn(3, 4).bfloat16(), torch.randn(2, 4).bfloat16()],
             "mask": [torch.tensor([1, 0, 1], dtype=torch.uint8)], "ids": [torch.arange(5), torch.arange(2)]}
    path = tmp_path / "x.safetensors"
    digest, size = write_safetensors(path, parts, {"k": "v"}, fsync=True)
    got = load_file(path)
    assert {k: torch.cat(v) for k, v in parts.items()}.keys() == got.keys()
    assert all(torch.equal(got[k], torch.cat(v)) for k, v in parts.items())
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"k": "v"}
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and size == path.stat().st_size
    assert tensor_sha256(parts) == tensor_sha256({k: torch.cat(v) for k, v in parts.items()})
    with pytest.raises(ValueError, match="'aux'"):  # mismatched parts: nothing written, no temp left
        write_safetensors(tmp_path / "y.safetensors", {"aux": [torch.zeros(2, 4), torch.zeros(2, 3)]}, {}, fsync=False)
    with pytest.raises(TypeError, match="meta"):  # fails with the temp open (a meta tensor has no bytes): the temp is removed
        write_safetensors(tmp_path / "z.safetensors", {"a": [torch.zeros(4)], "b": [torch.empty(2, device="meta")]}, {},
                          fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]


@pytest.mark.parametrize("nice", [False, True])
def test_writers_are_niced_only_when_asked(tmp_path, new_sink, nice):
    """On CPU serving the writer process yields to the forward (nice 19, every thread of it); on a GPU
    server it must not, or busy server threads starve it."""
    sink = new_sink(tmp_path, writers=2, nice_writers=nice)
    sink.add_chunk("r", "a", [1], torch.zeros(1, 2), torch.zeros(1, 1))
    sink.flush()  # the writer threads are running
    tasks = os.listdir(f"/proc/{sink.writer_pid}/task")
    assert len(tasks) >= 3  # the reading thread and the two writers
    want = 19 if nice else os.getpriority(os.PRIO_PROCESS, 0)
    assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks} == {want}
