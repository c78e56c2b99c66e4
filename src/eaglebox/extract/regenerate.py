"""Replace each assistant turn by the target's own greedy answer, through the capture server.

A draft predicts the target's tokens; trained on the target's own answers it sees the text it will
be asked to predict (the largest single lever on acceptance in published recipes). Turns are
regenerated in order, each from the conversation so far with the earlier turns already replaced.
Results are appended to ``regenerated.jsonl`` beside the shards as they finish, so a rerun
regenerates only what is missing; a torn last line from a killed run is ignored.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglebox import progress
from eaglebox.extract.dataset import Row

CACHE = "regenerated.jsonl"


def _load_cache(path: Path) -> dict[int, list[dict]]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # torn write of a killed run
            done[rec["line"]] = rec["messages"]
    return done


def regenerate(cfg, rows: list[Row], client, tokenizer, out_dir: Path, log=print) -> list[Row]:
    e = cfg.extract
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CACHE
    done = _load_cache(path)
    todo = [r for r in rows if r.messages is not None and r.line not in done]
    if any(r.messages is None for r in rows):
        log("regenerate: plain-text rows are kept as they are")

    def one(row: Row) -> tuple[int, list[dict]]:
        msgs = []
        for m in row.messages:
            if m["role"] != "assistant":
                msgs.append(m)
                continue
            prompt = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
            out = client.post("/generate", {"input_ids": prompt, "sampling_params": {
                "max_new_tokens": e.regenerate_max_new_tokens, "temperature": 0}})
            msgs.append({"role": "assistant", "content": tokenizer.decode(out["output_ids"], skip_special_tokens=True)})
        return row.line, msgs

    with open(path, "a") as f, ThreadPoolExecutor(e.concurrency) as pool:
        for line, msgs in progress.bar(iterable=pool.map(one, todo), total=len(todo), desc="regenerate",
                                       unit="conv"):
            f.write(json.dumps({"line": line, "messages": msgs}) + "\n")
            f.flush()
            done[line] = msgs
    return [Row(r.line, r.id, messages=done[r.line]) if r.messages is not None else r for r in rows]
