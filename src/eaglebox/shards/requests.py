"""How the client names capture requests, and how the server recognises them.

A capture request's rid is ``eaglebox-<sample_id>-<nonce>``: the sample id says which file the rows
belong to, the nonce makes every attempt (a retry, a duplicate) a request of its own, so the server
keys its pending rows by the whole rid and never merges two attempts at one sample.
"""

from __future__ import annotations

import uuid

RID_PREFIX = "eaglebox-"


def capture_rid(sample_id: str, nonce: str | None = None) -> str:
    return f"{RID_PREFIX}{sample_id}-{nonce or uuid.uuid4().hex[:8]}"


def sample_id_from_rid(rid: str) -> str | None:
    """``eaglebox-<sample_id>-<nonce>`` -> ``<sample_id>``; None for requests that are not captures."""
    if not isinstance(rid, str) or not rid.startswith(RID_PREFIX):
        return None
    sid, _, nonce = rid[len(RID_PREFIX):].rpartition("-")
    return sid if sid and nonce else None
