"""The corpus numbers of the extraction report."""

import random
import subprocess
import sys

from eaglebox.extract.diversity import answer_stats, longest_repeated_ngram, repeated_ngram_share


def test_a_looping_answer_is_dominated_by_its_repeated_phrase():
    loop = "I'm not sure " * 12 + "I'm"
    assert repeated_ngram_share(loop) > 0.9
    assert repeated_ngram_share("Ana lives in Paris.") == 0
    assert longest_repeated_ngram("a b c a b c x".split()) == (3, 2)
    assert longest_repeated_ngram("a a a a".split()) == (2, 2)
    assert repeated_ngram_share("we went to the park and then to the lake") == 4 / 10


def test_answer_stats_counts_distinct_answers_and_dominated_ones():
    answers = ["I'm not sure I'm not sure I'm not sure", "I'm not sure I'm not sure I'm not sure",
               "Ana lives in Paris.", " Ana lives in Paris. ", "1. cat\n2. dog\n3. fish"]
    s = answer_stats(answers)
    assert s["answers"] == 5 and s["distinct"] == 3 and s["distinct_ratio"] == 0.6
    assert s["repeated_ngram_dominant_share"] == 0.4
    assert s["most_common"]["count"] == 2


def _brute_force(words):
    """The definition, read literally: every n from the largest down, every n-gram, greedy counts."""
    for n in range(len(words) // 2, 0, -1):
        where = {}
        for i in range(len(words) - n + 1):
            where.setdefault(tuple(words[i : i + n]), []).append(i)
        best = 0
        for starts in where.values():
            count, end = 0, -1
            for s in starts:
                if s >= end:
                    count, end = count + 1, s + n
            best = max(best, count)
        if best >= 2:
            return n, best
    return 0, 0


def test_longest_repeat_equals_the_definition_on_random_answers():
    rng = random.Random(0)
    for _ in range(2000):
        words = [str(rng.randrange(rng.randint(1, 6))) for _ in range(rng.randint(0, 40))]
        if len(words) > 4 and rng.random() < 0.3:  # a copied passage, as a looping answer has
            a, b = rng.randrange(len(words)), rng.randrange(len(words))
            words = words[:b] + words[a : a + rng.randint(1, 10)] + words[b:]
        assert longest_repeated_ngram(words) == _brute_force(words), words


def test_report_on_long_answers_finishes_like_reading_them():
    """Super-linear guard, not a speed target: the literal search took 31 s for one 3,000-word answer with a
    repeated passage (issue 29) and ~hours for this corpus; the suffix array takes well under a second."""
    code = ("import random; from eaglebox.extract.diversity import answer_stats\n"
            "rng = random.Random(1); vocab = [f'w{i}' for i in range(3000)]\n"
            "answers = []\n"
            "for n in (3000, 6000, 12000):\n"
            "    w = [rng.choice(vocab) for _ in range(n)]\n"
            "    answers.append(' '.join(w + w[n // 3 : n // 2] + w[: n // 4]))\n"
            "s = answer_stats(answers); assert s['answers'] == 3 and s['max_repeated_ngram_share'] > 0.2, s\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
