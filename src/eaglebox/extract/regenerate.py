"""Replace each assistant turn by the target's own answer, through the capture server.

A draft predicts the target's tokens; trained on the target's own answers it sees the text it will
be asked to predict (the largest single lever on acceptance in published recipes). Turns are
regenerated in order, each from the conversation so far with the earlier turns already replaced.
Results are appended to ``regenerated.jsonl`` beside the shards as they finish, keyed by a hash of
the conversation and the generation settings (not by line: an edited or reordered corpus must not
reuse stale answers), so a rerun regenerates only what is missing; a torn last line from a killed
run is ignored.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglebox import progress
from eaglebox.config.schema import ExtractConfig
from eaglebox.extract.dataset import Row, read_chat_template, render_chat

CACHE = "regenerated.jsonl"


def cache_key(messages: list[dict], settings: dict) -> str:
    """What a regenerated conversation depends on: its turns and how the answers are generated."""
    return hashlib.sha256(json.dumps([messages, settings], sort_keys=True).encode()).hexdigest()


def _load_cache(path: Path) -> dict[str, list[dict]]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # torn write of a killed run
            if "key" in rec:  # older caches were keyed by line number: never trusted
                done[rec["key"]] = rec["messages"]
    return done


def sampling_params(e) -> dict:
    """The ``/generate`` sampling parameters of regeneration, from ``extract`` (``e``): greedy at
    ``regenerate_temperature`` 0, otherwise sampled with its top-p / top-k; part of the cache key."""
    return {"max_new_tokens": e.regenerate_max_new_tokens, "temperature": e.regenerate_temperature,
            "top_p": e.regenerate_top_p, "top_k": -1 if e.regenerate_top_k is None else e.regenerate_top_k,
            "repetition_penalty": e.regenerate_repetition_penalty}


def _keys(e: ExtractConfig, rows: list[Row]) -> dict[int, str]:
    settings = {"sampling": sampling_params(e), "chat_template": read_chat_template(e.chat_template)}
    return {r.line: cache_key(r.messages, settings) for r in rows if r.messages is not None}


def cached_rows(e: ExtractConfig, rows: list[Row], out_dir: Path) -> list[Row] | None:
    """``rows`` with every answer from the cache, or None when one is missing: lets a resumed run
    know its capture without starting a server."""
    done, keys = _load_cache(out_dir / CACHE), _keys(e, rows)
    if any(k not in done for k in keys.values()):
        return None
    return [Row(r.line, r.id, messages=done[keys[r.line]]) if r.messages is not None else r for r in rows]


def regenerate(e: ExtractConfig, rows: list[Row], client, tokenizer, out_dir: Path, log=print) -> list[Row]:
    template = read_chat_template(e.chat_template)
    sampling = sampling_params(e)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CACHE
    done = _load_cache(path)
    keys = _keys(e, rows)
    todo = [r for r in rows if r.messages is not None and keys[r.line] not in done]
    if any(r.messages is None for r in rows):
        log("regenerate: plain-text rows are kept as they are")

    def one(row: Row) -> tuple[str, list[dict]]:
        msgs = []
        for m in row.messages:
            if m["role"] != "assistant":
                msgs.append(m)
                continue
            prompt = render_chat(tokenizer, msgs, template, generation_prompt=True)
            out = client.post("/generate", {"input_ids": prompt, "sampling_params": sampling})
            msgs.append({"role": "assistant", "content": tokenizer.decode(out["output_ids"], skip_special_tokens=True)})
        return keys[row.line], msgs

    with open(path, "a") as f, ThreadPoolExecutor(e.concurrency) as pool:
        for key, msgs in progress.bar(iterable=pool.map(one, todo), total=len(todo), desc="regenerate",
                                      unit="conv"):
            f.write(json.dumps({"key": key, "messages": msgs}) + "\n")
            f.flush()
            done[key] = msgs
    return [Row(r.line, r.id, messages=done[keys[r.line]]) if r.messages is not None else r for r in rows]
