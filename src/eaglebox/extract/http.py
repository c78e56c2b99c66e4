"""HTTP calls to the capture server: bounded retries with backoff, and the capture request of one sample."""

from __future__ import annotations

import threading
import time

import requests

from eaglebox.extract import ExtractError
from eaglebox.extract.plan import Planned
from eaglebox.shards.requests import capture_rid


class Client:
    """HTTP calls to the capture server, with bounded retries and backoff."""

    def __init__(self, url: str, max_retries: int, backoff_s: float, alive=lambda: True):
        self.url, self.max_retries, self.backoff_s, self.alive = url, max_retries, backoff_s, alive
        self.session = threading.local()

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        sess = getattr(self.session, "s", None) or requests.Session()
        self.session.s = sess
        last = None
        for attempt in range(self.max_retries + 1):
            if not self.alive():
                raise ExtractError(f"the SGLang server at {self.url} has exited")
            try:
                r = sess.post(self.url + path, json=body, timeout=timeout)
                if r.status_code < 500:
                    if r.status_code != 200:
                        raise ExtractError(f"{path}: HTTP {r.status_code}: {r.text[:500]}")
                    return r.json()
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except requests.RequestException as err:
                last = f"{type(err).__name__}: {err}"
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise ExtractError(f"{self.url}{path} failed after {self.max_retries + 1} tries; last error: {last}")

def capture_one(client: Client, p: Planned, name: str | None = None) -> tuple[Planned, dict | None]:
    """Send one sample and check the server's answer; its file is written by the server's writer
    process and appears (atomically) a little later, as ``<capture dir>/<name>.safetensors`` (``name``: the
    sample id unless given; an online trainer's rank puts its files in a folder of its own). Returns the
    sample and the sink's numbers."""
    rid = capture_rid(name or p.id)
    body = {"input_ids": p.input_ids, "rid": rid, "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    out = client.post("/generate", body)
    meta = out.get("meta_info", {})
    hs = meta.get("hidden_states") or []
    refused = [h["error"] for h in hs if isinstance(h, dict) and "error" in h]
    if refused:
        raise ExtractError(f"sample at line {p.line}: the capture server refused it: {refused[0]}")
    if meta.get("prompt_tokens") != len(p.input_ids):
        raise ExtractError(f"sample at line {p.line}: server saw {meta.get('prompt_tokens')} prompt tokens, "
                           f"sent {len(p.input_ids)}")
    if len(hs) != 1 or not isinstance(hs[0], dict) or hs[0].get("rows") != len(p.input_ids):
        raise ExtractError(f"sample at line {p.line}: the server's capture answer {str(hs)[:300]} does not "
                           f"cover {len(p.input_ids)} rows (is the eaglebox hook active, radix cache off?)")
    return p, hs[0].get("sink")

