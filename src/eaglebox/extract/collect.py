"""Greedy continuations and their target features, from one capture server (the serving engine)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from eaglebox.extract.commit import verify_staged, wait_for_files
from eaglebox.extract.http import Client, capture_one
from eaglebox.extract.plan import Planned, sample_id
from eaglebox.shards.contract import CaptureSpec
from eaglebox.shards.format import DamagedSample, atomic_write_bytes, read_sample

HELDOUT = "heldout"
"""Where ``eaglebox check`` keeps its held-out samples, beside the shards they were captured with."""
HELDOUT_INDEX = "heldout.json"


def greedy(client: Client, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = client.post("/generate", {"input_ids": prompt,
                                    "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
    return out["output_ids"]


def heldout_key(spec: CaptureSpec, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> str:
    """Everything that decides the held-out samples: the spec (target weights, engine, its flags, layers),
    the prompts' token ids, the continuation length (greedy, so no other sampling setting) and the requests
    in flight (a decode batch of another size may break a near-tie otherwise)."""
    text = json.dumps([spec.as_json(), prompts, max_new_tokens, "greedy", concurrency], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def load_heldout(folder: Path, key: str, prompts: list[list[int]], spec: CaptureSpec, log=print):
    """:func:`collect`'s samples as kept in ``folder`` under ``key``, each file verified as a committed
    sample is; None when nothing is kept, the index is unreadable, another key is kept, or a file fails
    (they are collected again)."""
    index = folder / HELDOUT_INDEX
    if not index.exists():
        return None
    try:
        kept = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError) as err:
        log(f"check: {index} is unreadable ({err}): collecting the held-out samples again")
        return None
    if kept.get("key") != key:
        log(f"check: {folder} holds held-out samples of another capture, prompts, length or concurrency: collecting again")
        return None
    try:
        aux = {}
        for sid, entry in kept["samples"].items():
            s = read_sample(folder / f"{sid}.safetensors", entry["sha256"], entry["rows"], spec)
            aux[sid] = (s["input_ids"].long(), s["aux"].float())
    except DamagedSample as err:
        log(f"check: {err}: collecting the held-out samples again")
        return None
    return [(*aux[sid], len(p)) for sid, p in zip(kept["order"], prompts)]


def collect(client: Client, prompts: list[list[int]], max_new_tokens: int, staging: Path, spec: dict,
            concurrency: int = 1, keep: Path | None = None, key: str | None = None):
    """[(seq, aux features, prompt_len)] with seq = prompt + the target's greedy continuation.

    ``concurrency`` requests at a time, as the capture sends them: the server decodes the continuations
    as one batch instead of one prompt after another (the Kimi-shaped tiny target's decode step on a CPU
    costs about as much for 8 requests as for 1: its evaluation went from 119 s to 39 s, docs/testing.md).
    The continuations first, then the features of each distinct sequence (a prompt given twice is captured
    once: its file would be shared). With ``keep``, the sample files are kept there under ``key``
    (:func:`load_heldout` reads them back), so a resumed check needs no server.
    """
    if keep is not None:
        shutil.rmtree(keep, ignore_errors=True)  # whatever was kept is stale: its key differs
        keep.mkdir(parents=True)
    with ThreadPoolExecutor(concurrency) as pool:
        seqs = [p + out for p, out in zip(prompts, pool.map(lambda p: greedy(client, p, max_new_tokens), prompts))]
        planned: dict[str, Planned] = {}
        for i, seq in enumerate(seqs):
            sid = sample_id(seq, spec)
            planned.setdefault(sid, Planned(sid, i + 1, seq, [1] * len(seq)))

        shas: dict[str, str] = {}

        def features(p: Planned) -> tuple[str, torch.Tensor]:
            capture_one(client, p)
            path = staging / f"{p.id}.safetensors"
            wait_for_files([(path, f"prompt {p.line}")])
            shas[p.id] = verify_staged(path, p, spec)
            aux = read_sample(path, shas[p.id], len(p.input_ids), spec)["aux"].float()
            if keep is None:
                path.unlink()
            else:
                os.replace(path, keep / path.name)  # the staging folder is inside the shards' folder
            return p.id, aux

        aux = dict(pool.map(features, planned.values()))
    if keep is not None:
        index = {"key": key, "order": [sample_id(seq, spec) for seq in seqs],
                 "samples": {sid: {"sha256": shas[sid], "rows": len(p.input_ids)} for sid, p in planned.items()}}
        atomic_write_bytes(keep / HELDOUT_INDEX, (json.dumps(index, indent=1) + "\n").encode())
    return [(torch.tensor(seq), aux[sample_id(seq, spec)], len(p)) for p, seq in zip(prompts, seqs)]
