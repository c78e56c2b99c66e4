"""Chat data sets in, token ids and assistant-only loss masks out, with bad rows named by line.

Formats (per row, ``auto`` detects): ShareGPT ``{"conversations": [{"from": "human", "value": ...}]}``,
OpenAI ``{"messages": [{"role": "user", "content": ...}]}`` (content a string or a list of text
parts), plain ``{"text": ...}``. Files are JSONL (UTF-8, a BOM allowed; each line decoded on its own,
so one bad byte is one bad row) or Parquet. Rows over a byte cap are refused before they are parsed
or tokenized (a 10 MB line would otherwise be tokenized for tens of seconds, then dropped). The loss mask covers assistant tokens only (all tokens for ``text``): each
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


def read_rows(path: Path, fmt: str = "auto", max_bytes: int | None = None) -> Iterator[Row | BadRow]:
    """Rows of the file; malformed ones, and rows over ``max_bytes``, come back as :class:`BadRow`
    (the caller decides)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"extract.dataset: {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = ((i + 1, r) for i, r in enumerate(pq.read_table(path).to_pylist()))
    else:
        records = _jsonl(path, max_bytes)
    for line, rec in records:
        if isinstance(rec, BadRow):
            yield rec
            continue
        try:
            row = _parse(rec, line, fmt)
        except ValueError as err:
            yield BadRow(path, line, str(err))
            continue
        size = _text_bytes(row)
        yield BadRow(path, line, _too_big(size, max_bytes)) if max_bytes and size > max_bytes else row


def _too_big(size: int, max_bytes: int) -> str:
    return f"{size:,} bytes, over extract.max_row_bytes={max_bytes:,}"


def _text_bytes(row: Row) -> int:
    texts = [row.text] if row.text is not None else [m["content"] for m in row.messages]
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def _jsonl(path: Path, max_bytes: int | None):
    """(line number, object or BadRow); lines are read as bytes and decoded one by one."""
    with open(path, "rb") as f:
        offset = 0
        for line_no, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if max_bytes and len(raw) > max_bytes:
                yield line_no, BadRow(path, line_no, _too_big(len(raw), max_bytes))
                continue
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                yield line_no, BadRow(path, line_no, f"not valid UTF-8 (byte {start + err.start:,} of the file: "
                                                     f"{raw[err.start:err.start + 1]!r})")
                continue
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
        if isinstance(content, list) and fmt == "messages":
            content = _text_parts(content, f"{key}[{i}]")
        if not isinstance(content, str):
            raise ValueError(f"{key}[{i}]: content is missing or not a string")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError("empty conversation: no non-empty assistant turn")
    return Row(line, rid, messages=messages)


def _text_parts(parts: list, where: str) -> str:
    """OpenAI content parts: text parts joined; anything else cannot be captured as text."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"{where}.content[{j}]: a {kind!r} part; only text parts can be captured")
        texts.append(part["text"])
    return "".join(texts)


def read_chat_template(path: str | Path | None) -> str | None:
    """``extract.chat_template`` (a Jinja file) as text; None keeps the tokenizer's own template."""
    return Path(path).read_text() if path else None


def render_chat(tokenizer, messages: list[dict], chat_template: str | None, *, generation_prompt: bool) -> list[int]:
    """The one way a conversation becomes token ids. Extraction, regeneration and bench prompts all
    call it, so the target sees the same tokens for the same conversation in all three."""
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                         chat_template=chat_template, return_dict=False)


def prompt_ids(row: Row, tokenizer, chat_template: str | None = None) -> list[int]:
    """What the target is asked: a text row whole, a conversation up to its first assistant turn."""
    if row.text is not None:
        return tokenizer(row.text, add_special_tokens=True)["input_ids"]
    first = next(i for i, m in enumerate(row.messages) if m["role"] == "assistant")
    return render_chat(tokenizer, row.messages[:first], chat_template, generation_prompt=True)


def tokenize(row: Row, tokenizer, chat_template: str | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) for a row; the mask is 1 on assistant tokens (all tokens for text)."""
    if row.text is not None:
        ids = tokenizer(row.text, add_special_tokens=True)["input_ids"]
        return ids, [1] * len(ids)

    def render(msgs, gen):
        return render_chat(tokenizer, msgs, chat_template, generation_prompt=gen)

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
