"""Client-side faults: a dead server, a restarting one (503 then OK), a disk that is too small."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglebox.capture.hook import VersionMismatch, check_sglang_version
from eaglebox.extract import ExtractError
from eaglebox.extract.commit import wait_for_files
from eaglebox.extract.http import Client
from eaglebox.extract.plan import bytes_per_token, check_disk


def test_dead_server_gets_bounded_retries_then_a_clear_error():
    client = Client("http://127.0.0.1:9", max_retries=2, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(ExtractError, match=r"127.0.0.1:9/generate failed after 3 tries; last error: ConnectionError"):
        client.post("/generate", {})
    assert 0.15 <= time.monotonic() - t0 < 5  # backoff 0.05 + 0.1


def test_server_that_restarts_is_retried_until_it_answers():
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append(self.path)
            code, body = (503, b"restarting") if len(calls) < 3 else (200, json.dumps({"ok": True}).encode())
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{srv.server_port}", max_retries=3, backoff_s=0.01)
        assert client.post("/generate", {}) == {"ok": True}
        assert len(calls) == 3
        client = Client(f"http://127.0.0.1:{srv.server_port}", max_retries=0, backoff_s=0.01)
        calls.clear()
        with pytest.raises(ExtractError, match="HTTP 503: restarting"):
            client.post("/generate", {})
    finally:
        srv.shutdown()


def test_a_dead_server_process_stops_retries_at_once():
    client = Client("http://127.0.0.1:9", max_retries=50, backoff_s=1, alive=lambda: False)
    with pytest.raises(ExtractError, match="has exited"):
        client.post("/generate", {})


def test_a_server_that_exits_while_a_file_is_awaited_ends_the_wait_at_once(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", "pass"])  # a process that has exited by the check
    server.wait()
    t0 = time.monotonic()
    with pytest.raises(ExtractError, match="line 3: the SGLang server exited before it wrote"):
        wait_for_files([(tmp_path / "s.safetensors", "sample at line 3")], wait_s=60,
                       alive=lambda: server.poll() is None)
    assert time.monotonic() - t0 < 5  # not the 60 s of waiting for a writer


def test_disk_budget_refuses_with_the_numbers(tmp_path):
    # Kimi-K2.5: 3 aux + last, hidden 7168, bf16 -> 57,344 bytes of features per token
    assert bytes_per_token(7168, 3, 2) == 57_344 + 9
    with pytest.raises(ExtractError, match=r"needs [\d.]+ GB \(10,000,000,000 tokens x 57,353 bytes/token"):
        check_disk(tmp_path / "new" / "dir", 10_000_000_000, 57_353)
    check_disk(tmp_path, 1000, 57_353)
    assert not (tmp_path / "new").exists()


def test_hook_refuses_other_sglang_versions():
    check_sglang_version("0.5.23")
    with pytest.raises(VersionMismatch, match="written for SGLang 0.5.23, but SGLang 0.5.22 is running"):
        check_sglang_version("0.5.22")
