"""Extraction client: data set rows to verified capture requests to shards; held-out prompts and their
greedy continuations' features for the evaluators."""
