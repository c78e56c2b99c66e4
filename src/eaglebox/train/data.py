"""Samples from the shards, in a deterministic order that a resumed run can re-enter mid-epoch, read
and verified ahead of the step by loader threads."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from eaglebox.shards.format import ShardReader


def batch_indices(n: int, seed: int, epoch: int, step_in_epoch: int, world: int, rank: int,
                  batch_size: int) -> list[int]:
    """This rank's samples for one step. Global step ``k`` of an epoch takes the permutation's
    ``k``-th run of ``world * batch_size`` samples and rank ``r`` its ``r``-th slice, so what a step
    trains on depends only on the global batch: 2 ranks x 4 samples = 1 rank x 8 samples."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    start = (step_in_epoch * world + rank) * batch_size
    return perm[start : start + batch_size]


def steps_per_epoch(n: int, world: int, batch_size: int) -> int:
    return n // (world * batch_size)


def collate(reader: ShardReader, indices: list[int], max_length: int, pad_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded batch on the host, each sample verified as it is read (:meth:`ShardReader.get_many`);
    ``valid`` marks real tokens. ``pad_multiple`` rounds the length up, so a compiled step sees few
    distinct shapes."""
    samples = reader.get_many(indices, max_rows=max_length)
    T = -(-max(s["input_ids"].shape[0] for s in samples) // pad_multiple) * pad_multiple
    B = len(samples)
    first = samples[0]
    out = {
        "input_ids": torch.zeros(B, T, dtype=torch.int64),
        "loss_mask": torch.zeros(B, T, dtype=torch.bool),
        "valid": torch.zeros(B, T, dtype=torch.bool),
        "aux": torch.zeros(B, T, first["aux"].shape[1], dtype=first["aux"].dtype),
        "last": torch.zeros(B, T, first["last"].shape[1], dtype=first["last"].dtype),
    }
    for b, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        out["input_ids"][b, :n] = s["input_ids"]
        out["loss_mask"][b, :n] = s["loss_mask"].bool()
        out["valid"][b, :n] = True
        out["aux"][b, :n] = s["aux"]
        out["last"][b, :n] = s["last"]
    return out


T = TypeVar("T")
R = TypeVar("R")


def prefetch(fn: Callable[[T], R], items: Iterable[T], threads: int) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` in order, with ``fn`` run by ``threads`` threads up to ``threads`` items
    ahead (each result held in memory until its turn): the training step never waits for a read and
    its hash unless the disk or the hashing is slower than the step. The first error is raised when its
    item's turn comes; closing the iterator cancels what is queued."""
    pending: deque = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="eaglebox-loader") as pool:
        try:
            for item in items:
                pending.append((item, pool.submit(fn, item)))
                if len(pending) > threads:
                    item, fut = pending.popleft()
                    yield item, fut.result()
            while pending:
                item, fut = pending.popleft()
                yield item, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()
