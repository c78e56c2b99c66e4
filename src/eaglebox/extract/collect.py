"""Greedy continuations and their target features, from one capture server (the serving engine)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from eaglebox.extract.commit import verify_staged, wait_for_files
from eaglebox.extract.http import Client, capture_one
from eaglebox.extract.plan import Planned, sample_id
from eaglebox.shards.format import read_sample


def greedy(client: Client, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = client.post("/generate", {"input_ids": prompt,
                                    "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
    return out["output_ids"]


def collect(client: Client, prompts: list[list[int]], max_new_tokens: int, staging: Path, spec: dict,
            concurrency: int = 1):
    """[(seq, aux features, prompt_len)] with seq = prompt + the target's greedy continuation.

    ``concurrency`` requests at a time, as the capture sends them: the server decodes the continuations
    as one batch instead of one prompt after another (the Kimi-shaped tiny target's decode step on a CPU
    costs about as much for 8 requests as for 1: its evaluation went from 119 s to 39 s, docs/testing.md).
    The continuations first, then the features of each distinct sequence (a prompt given twice is captured
    once: its file would be shared).
    """
    with ThreadPoolExecutor(concurrency) as pool:
        seqs = [p + out for p, out in zip(prompts, pool.map(lambda p: greedy(client, p, max_new_tokens), prompts))]
        planned: dict[str, Planned] = {}
        for i, seq in enumerate(seqs):
            sid = sample_id(seq, spec)
            planned.setdefault(sid, Planned(sid, i + 1, seq, [1] * len(seq)))

        def features(p: Planned) -> tuple[str, torch.Tensor]:
            capture_one(client, p)
            path = staging / f"{p.id}.safetensors"
            wait_for_files([(path, f"prompt {p.line}")])
            aux = read_sample(path, verify_staged(path, p, spec), len(p.input_ids), spec)["aux"]
            path.unlink()
            return p.id, aux.float()

        aux = dict(pool.map(features, planned.values()))
    return [(torch.tensor(seq), aux[sample_id(seq, spec)], len(p)) for p, seq in zip(prompts, seqs)]
