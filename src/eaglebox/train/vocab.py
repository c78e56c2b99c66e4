"""The draft vocabulary: the most frequent loss-masked target tokens, as SGLang's ``d2t``/``t2d``.

``d2t[i] = target_id - i`` for draft id ``i`` (SGLang adds ``arange`` back); ``t2d[j]`` is True for
target ids in the draft vocabulary. Ties break by the smaller token id, so the result is
deterministic; a vocabulary larger than the tokens seen is filled with the smallest unseen ids.
"""

from __future__ import annotations

import torch

from eaglebox.shards.format import ShardReader


def token_counts(reader: ShardReader, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(len(reader)):  # ids and masks come from the shard indexes: no feature bytes are read
        ids, mask = reader.ids_and_mask(i)
        ids = ids[mask.bool()]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


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
