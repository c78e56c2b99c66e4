"""How varied a corpus of answers is: does a draft trained and measured on it learn to predict, or a loop?

A target that answers many prompts with the same text, or with one phrase repeated until the token
limit, makes acceptance length easy: the draft learns the loop. These numbers go into the
extraction report so that a corpus like that is visible before anything is trained on it.
"""

from __future__ import annotations

from collections import Counter

DOMINANT_SHARE = 0.5
"""An answer whose longest repeated n-gram covers more than this share of its words is dominated by it."""


def longest_repeated_ngram(words: list[str]) -> tuple[int, int]:
    """``(n, count)``: the largest ``n`` such that some n-gram of ``words`` occurs at least twice without
    overlapping, and the most non-overlapping occurrences any n-gram of that length has; ``(0, 0)``
    when no word occurs twice."""
    for n in range(len(words) // 2, 0, -1):
        where: dict[tuple[str, ...], list[int]] = {}
        for i in range(len(words) - n + 1):
            where.setdefault(tuple(words[i : i + n]), []).append(i)
        best = 0
        for starts in where.values():
            count, end = 0, -1
            for s in starts:  # greedy left to right: the most non-overlapping occurrences
                if s >= end:
                    count, end = count + 1, s + n
            best = max(best, count)
        if best >= 2:
            return n, best
    return 0, 0


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
