from eaglebox.extract.throughput import Throughput, capture_bound, disk_write_rate

GB = 10**9


def test_capture_is_bound_by_prefill_when_nothing_waited_for_the_writers():
    assert capture_bound(100, 50 * GB, 2 * GB, budget_wait_s=1, files_wait_s=2) == "prefill"
    assert capture_bound(100, 150 * GB, None, budget_wait_s=0, files_wait_s=0) == "prefill"


def test_capture_that_waited_for_writers_is_bound_by_the_disk_at_its_rate_else_by_the_writers():
    # the H200 runs of issue 29: 0.37-0.47 GB/s captured, disk 1.3-1.4 GB/s, the scheduler at the byte budget
    assert capture_bound(100, 40 * GB, 1.34 * GB, budget_wait_s=60, files_wait_s=0) == "writers"
    assert capture_bound(100, 120 * GB, 1.34 * GB, budget_wait_s=30, files_wait_s=0) == "disk"
    # a run under the byte budget: the client, not the scheduler, waited for the files
    assert capture_bound(100, 40 * GB, 1.34 * GB, budget_wait_s=0, files_wait_s=15) == "writers"
    assert capture_bound(100, 40 * GB, None, budget_wait_s=20, files_wait_s=0) == "writers"  # disk unknown


def test_report_from_the_sinks_numbers(tmp_path):
    speed = Throughput(disk_bps=2 * GB, feature_bytes_per_token=4 * 4096 * 2)
    speed.add(1000, {"samples": 2, "budget_wait_s": 0.0, "hash_s": 1.5, "write_s": 2.5, "writers": 4})
    speed.add(3000, {"samples": 1, "budget_wait_s": 0.0})  # an older snapshot answered later: kept the newer
    speed.files_wait_s = 0.0
    r = speed.report()
    assert r["bytes"] == 4000 * 4 * 4096 * 2 and r["bound_by"] == "prefill" and r["disk_gb_s"] == 2.0
    assert r["server_samples"] == 2 and r["server_hash_s"] == 1.5
    assert "capture" in speed.postfix() and "disk 2.00 GB/s" in speed.postfix()
    assert "bound by prefill" in speed.line()
    assert Throughput(None, 1).line() == "extract: nothing captured in this run"


def test_disk_rate_is_measured_and_leaves_nothing(tmp_path):
    rate = disk_write_rate(tmp_path, 8 << 20)
    assert rate is not None and rate > 0 and list(tmp_path.iterdir()) == []
    assert disk_write_rate(tmp_path / "missing") is None
