"""Extraction client: data set rows to verified capture requests to shards; held-out prompts and their
greedy continuations' features for the evaluators.

One job a module: ``plan`` (rows -> planned samples, the resume check, the disk checks), ``http`` (the
capture server's HTTP calls, with retries), ``commit`` (staged samples verified and committed into shards,
the manifest), ``throughput`` (the capture's speed and what bound it), ``run`` (the order of work)."""

from eaglebox.errors import EagleboxError


class ExtractError(EagleboxError):
    pass
