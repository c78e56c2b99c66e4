"""Held-out bench prompts: each conversation up to its first assistant turn, chat-templated."""

from __future__ import annotations

from pathlib import Path

from eaglebox.extract.dataset import BadRow, read_rows


def load_prompts(path: Path, tokenizer, n: int, fmt: str = "auto") -> list[list[int]]:
    prompts = []
    for row in read_rows(path, fmt):
        if isinstance(row, BadRow):
            raise row
        if row.text is not None:
            prompts.append(tokenizer(row.text, add_special_tokens=True)["input_ids"])
        else:
            first = next(i for i, m in enumerate(row.messages) if m["role"] == "assistant")
            prompts.append(tokenizer.apply_chat_template(row.messages[:first], tokenize=True,
                                                         add_generation_prompt=True, return_dict=False))
        if len(prompts) == n:
            break
    return prompts
