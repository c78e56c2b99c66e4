"""The draft vocabulary: the most frequent loss-masked target tokens, as SGLang's ``d2t``/``t2d``.

``d2t[i] = target_id - i`` for draft id ``i`` (SGLang adds ``arange`` back); ``t2d[j]`` is True for
target ids in the draft vocabulary. Ties break by the smaller token id, so the result is
deterministic; a vocabulary larger than the tokens seen is filled with the smallest unseen ids.
"""

from __future__ import annotations

import torch

from eaglebox.shards.format import ShardReader
from eaglebox.train.dist import Dist


def token_counts(reader: ShardReader, vocab_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """How often each target id is loss-masked, over this rank's share of the samples: rank ``r`` of
    ``world`` counts the ``r``-th contiguous run of them (so it touches about 1/world of the shard
    indexes); the shares sum to the whole (:func:`draft_vocab`). Ids at or past ``vocab_size`` are
    not counted. Ids and masks come from the shard indexes: no feature bytes are read."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    n = len(reader)
    for i in range(rank * n // world, (rank + 1) * n // world):
        ids, mask = reader.ids_and_mask(i)
        ids = ids[mask.bool()]
        ids = ids[ids < vocab_size]
        # index_add_, not bincount(minlength=vocab_size): that allocates and adds a vocabulary-sized
        # tensor per sample (docs/measurements.md, "Measurements behind the code")
        counts.index_add_(0, ids, torch.ones_like(ids))
    return counts


def draft_vocab(reader: ShardReader, vocab_size: int, draft_vocab_size: int,
                d: Dist) -> tuple[torch.Tensor, torch.Tensor]:
    """``d2t``, ``t2d`` over all samples, each rank counting its share (collective under ``torchrun``:
    every rank gets the same sums, hence the same vocabulary as one process)."""
    counts = d.sum(token_counts(reader, vocab_size, d.rank, d.world).to(d.device)).cpu()
    return build_vocab(counts, draft_vocab_size)


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    vocab_size = counts.numel()
    if draft_vocab_size > vocab_size:
        raise ValueError(f"train.draft.draft_vocab_size={draft_vocab_size} exceeds the target vocabulary ({vocab_size})")
    # stable sort on -count keeps ascending ids among equal counts
    order = torch.sort(-counts, stable=True).indices[:draft_vocab_size]
    used = torch.sort(order).values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d
