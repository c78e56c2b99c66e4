"""Greedy continuations and their target features, from one capture server (the serving engine)."""

from __future__ import annotations

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


def collect(client: Client, prompts: list[list[int]], max_new_tokens: int, staging: Path, spec: dict):
    """[(seq, aux features, prompt_len)] with seq = prompt + the target's greedy continuation."""
    out = []
    for i, prompt in enumerate(prompts):
        seq = prompt + greedy(client, prompt, max_new_tokens)
        p = Planned(sample_id(seq, spec), i + 1, seq, [1] * len(seq))
        capture_one(client, p)
        path = staging / f"{p.id}.safetensors"
        wait_for_files([(path, f"prompt {i + 1}")])
        aux = read_sample(path, verify_staged(path, p, spec), len(seq), spec)["aux"]
        path.unlink()
        out.append((torch.tensor(seq), aux.float(), len(prompt)))
    return out
