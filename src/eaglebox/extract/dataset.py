"""Chat data sets in, token ids and assistant-only loss masks out, with bad rows named by line.

Formats (per row, ``auto`` detects): ShareGPT ``{"conversations": [{"from": "human", "value": ...}]}``,
OpenAI ``{"messages": [{"role": "user", "content": ...}]}``, plain ``{"text": ...}``. Files are
JSONL or Parquet. The loss mask covers assistant tokens only (all tokens for ``text``): each
assistant turn is located by rendering the conversation up to it, which needs a template whose
rendering of a prefix is a prefix of the full rendering -- checked, not assumed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}
FIELDS = {"conversations": "sharegpt", "messages": "messages", "text": "text"}
"""The field that identifies each format, in detection order."""


class BadRow(ValueError):
    def __init__(self, path: Path, line: int, reason: str):
        super().__init__(f"{path}: line {line}: {reason}")
        self.line = line


@dataclass
class Row:
    line: int
    id: str
    messages: list[dict] | None = None
    text: str | None = None


def read_rows(path: Path, fmt: str = "auto") -> Iterator[Row | BadRow]:
    """Rows of the file; malformed ones come back as :class:`BadRow` (the caller decides)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"extract.dataset: {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = ((i + 1, r) for i, r in enumerate(pq.read_table(path).to_pylist()))
    else:
        records = _jsonl(path)
    for line, rec in records:
        if isinstance(rec, BadRow):
            yield rec
            continue
        try:
            yield _parse(rec, line, fmt)
        except ValueError as err:
            yield BadRow(path, line, str(err))


def _jsonl(path: Path):
    with open(path) as f:
        for line_no, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                yield line_no, json.loads(text)
            except json.JSONDecodeError as err:
                yield line_no, BadRow(path, line_no, f"not valid JSON ({err.msg} at column {err.colno})")


def _parse(rec, line: int, fmt: str) -> Row:
    if not isinstance(rec, dict):
        raise ValueError("a row must be a JSON object")
    if fmt == "auto":
        fmt = next((f for key, f in FIELDS.items() if key in rec), None)
        if fmt is None:
            raise ValueError("no 'conversations', 'messages' or 'text' field")
    rid = str(rec.get("id", f"line-{line}"))
    if fmt == "text":
        text = rec.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("'text' is missing or empty")
        return Row(line, rid, text=text)
    key = "conversations" if fmt == "sharegpt" else "messages"
    turns = rec.get(key)
    if not isinstance(turns, list):
        raise ValueError(f"'{key}' is missing or not a list")
    messages = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValueError(f"{key}[{i}] is not an object")
        if fmt == "sharegpt":
            role, content = SHAREGPT_ROLES.get(str(t.get("from", "")).lower()), t.get("value")
        else:
            role, content = t.get("role"), t.get("content")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"{key}[{i}]: unknown role {t.get('from', t.get('role'))!r}")
        if not isinstance(content, str):
            raise ValueError(f"{key}[{i}]: content is missing or not a string")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError("empty conversation: no non-empty assistant turn")
    return Row(line, rid, messages=messages)


def tokenize(row: Row, tokenizer, chat_template: str | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) for a row; the mask is 1 on assistant tokens (all tokens for text)."""
    if row.text is not None:
        ids = tokenizer(row.text, add_special_tokens=True)["input_ids"]
        return ids, [1] * len(ids)

    def render(msgs, gen):
        return tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen,
                                             chat_template=chat_template, return_dict=False)

    ids = render(row.messages, False)
    mask = [0] * len(ids)
    for i, m in enumerate(row.messages):
        if m["role"] != "assistant":
            continue
        before = render(row.messages[:i], True)
        upto = render(row.messages[: i + 1], False)
        start = len(before)
        if before != ids[:start] or upto != ids[: len(upto)] or start > len(upto):
            raise ValueError("the chat template does not render a conversation prefix as a token prefix; "
                             "the assistant loss mask cannot be located")
        mask[start : len(upto)] = [1] * (len(upto) - start)
    return ids, mask
