"""How varied a corpus of answers is: does a draft trained and measured on it learn to predict, or a loop?

A target that answers many prompts with the same text, or with one phrase repeated until the token
limit, makes acceptance length easy: the draft learns the loop. These numbers go into the
extraction report so that a corpus like that is visible before anything is trained on it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from eaglebox.config.schema import ExtractConfig

DOMINANT_SHARE = 0.5
"""An answer whose longest repeated n-gram covers more than this share of its words is dominated by it."""


def _suffix_array(seq: list[int]) -> list[int]:
    """Start positions of ``seq``'s suffixes in sorted order, by prefix doubling: O(n log^2 n), and
    O(n log n) for text whose repeats are short (the rounds stop once every rank is distinct)."""
    n = len(seq)
    rank, sa, k = list(seq), list(range(n)), 1
    while n > 1:
        # one int per suffix for the pair (rank[i], rank[i + k]), -1 past the end sorting first
        key = [rank[i] * (n + 1) + (rank[i + k] + 1 if i + k < n else 0) for i in range(n)]
        sa.sort(key=key.__getitem__)
        new = [0] * n
        for j in range(1, n):
            new[sa[j]] = new[sa[j - 1]] + (key[sa[j - 1]] != key[sa[j]])
        rank = new
        if rank[sa[-1]] == n - 1:
            break
        k *= 2
    return sa


def _lcp(seq: list[int], sa: list[int]) -> list[int]:
    """``lcp[j]``: the common prefix length of suffixes ``sa[j-1]`` and ``sa[j]`` (Kasai: O(n))."""
    n = len(seq)
    rank = [0] * n
    for j, i in enumerate(sa):
        rank[i] = j
    lcp, h = [0] * n, 0
    for i in range(n):
        if rank[i] > 0:
            p = sa[rank[i] - 1]
            while i + h < n and p + h < n and seq[i + h] == seq[p + h]:
                h += 1
            lcp[rank[i]] = h
            h = max(h - 1, 0)
        else:
            h = 0
    return lcp


def _groups(sa: list[int], lcp: list[int], n: int):
    """The start positions of each n-gram that occurs at least twice: runs of ``sa`` joined by ``lcp >= n``."""
    group = [sa[0]]
    for j in range(1, len(sa)):
        if lcp[j] >= n:
            group.append(sa[j])
            continue
        if len(group) > 1:
            yield group
        group = [sa[j]]
    if len(group) > 1:
        yield group


def longest_repeated_ngram(words: list[str]) -> tuple[int, int]:
    """``(n, count)``: the largest ``n`` such that some n-gram of ``words`` occurs at least twice without
    overlapping, and the most non-overlapping occurrences any n-gram of that length has; ``(0, 0)``
    when no word occurs twice.

    O(n log^2 n) in the answer's length (a suffix array, then a binary search on ``n``: a non-overlapping
    repeat of length ``n`` has one of every shorter length in it), so a corpus report of long answers
    costs about what reading them does."""
    ids: dict[str, int] = {}
    seq = [ids.setdefault(w, len(ids)) for w in words]
    if len(ids) == len(seq):
        return 0, 0
    sa = _suffix_array(seq)
    lcp = _lcp(seq, sa)

    def repeats(n: int) -> bool:
        return any(max(g) - min(g) >= n for g in _groups(sa, lcp, n))

    lo, hi = 1, len(seq) // 2  # repeats(lo) holds (some word occurs twice); find the largest n that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if repeats(mid) else (lo, mid - 1)
    best = 0
    for starts in _groups(sa, lcp, lo):
        count, end = 0, -1
        for s in sorted(starts):  # greedy left to right: the most non-overlapping occurrences
            if s >= end:
                count, end = count + 1, s + lo
        best = max(best, count)
    return lo, best


def repeated_ngram_share(answer: str) -> float:
    """The share of an answer's words (split on whitespace) that its longest repeated n-gram covers:
    ``n * count / len(words)`` with ``(n, count)`` from :func:`longest_repeated_ngram`; 0 for no
    repetition, 1.0 for one phrase said over and over ("I'm not sure I'm not sure" is 1.0, a sentence
    that repeats one word out of ten is 0.2)."""
    words = answer.split()
    n, count = longest_repeated_ngram(words)
    return n * count / len(words) if words else 0.0


def answer_stats(answers: list[str]) -> dict:
    """The corpus numbers of the extraction report.

    - ``distinct_ratio``: distinct answers (exact text, surrounding whitespace stripped) / answers.
    - ``repeated_ngram_dominant_share``: the share of answers whose longest repeated n-gram covers
      more than :data:`DOMINANT_SHARE` of their words (:func:`repeated_ngram_share`): answers that are
      mostly one phrase repeated.
    - ``max_repeated_ngram_share``: the largest :func:`repeated_ngram_share` of any answer.
    - ``most_common``: the most frequent answer (cut to 120 characters) and how often it occurs.
    """
    texts = [a.strip() for a in answers]
    if not texts:
        return {"answers": 0}
    shares = [repeated_ngram_share(a) for a in texts]
    top, top_count = Counter(texts).most_common(1)[0]
    return {"answers": len(texts), "distinct": len(set(texts)),
            "distinct_ratio": round(len(set(texts)) / len(texts), 4),
            "repeated_ngram_dominant_share": round(sum(s > DOMINANT_SHARE for s in shares) / len(texts), 4),
            "max_repeated_ngram_share": round(max(shares), 4),
            "mean_words": round(sum(len(a.split()) for a in texts) / len(texts), 1),
            "most_common": {"text": top[:120], "count": top_count}}


CORPUS = "corpus.json"
"""The answers' corpus numbers (:func:`corpus_report`), beside the shards."""


def shard_answers(reader, tokenizer) -> list[str]:
    """Every answer in the shards, as text: each run of loss-masked tokens of each sample, decoded
    without special tokens (the target's own answers when extraction regenerated them)."""
    import torch

    out = []
    for i in range(len(reader)):
        ids, mask = reader.ids_and_mask(i)
        m = torch.cat([torch.zeros(1, dtype=torch.bool), mask.bool(), torch.zeros(1, dtype=torch.bool)])
        edges = (m[1:] != m[:-1]).nonzero().flatten().tolist()
        for a, b in zip(edges[::2], edges[1::2]):
            out.append(tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=True))
    return out


def corpus_report(e: ExtractConfig, tokenizer) -> dict:
    """How varied the shards' answers are (:func:`eaglebox.extract.diversity.answer_stats`: distinct-answer
    ratio, share of answers dominated by their longest repeated n-gram); written to ``corpus.json`` in
    ``extract.output_dir`` and returned."""
    from eaglebox.shards.format import ShardReader

    out = Path(e.output_dir)
    report = {"regenerated": e.regenerate, **answer_stats(shard_answers(ShardReader(out), tokenizer))}
    (out / CORPUS).write_text(json.dumps(report, indent=1) + "\n")
    return report
