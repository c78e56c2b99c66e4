"""The corpus numbers of the extraction report."""

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
