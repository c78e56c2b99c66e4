"""Held-out bench prompts: each conversation up to its first assistant turn, rendered as extraction does."""

from __future__ import annotations

from pathlib import Path

from eaglebox.extract.dataset import BadRow, prompt_ids, read_chat_template, read_rows


def load_prompts(path: Path, tokenizer, n: int, fmt: str = "auto", chat_template: str | None = None) -> list[list[int]]:
    prompts = []
    for row in read_rows(path, fmt):
        if isinstance(row, BadRow):
            raise row
        prompts.append(prompt_ids(row, tokenizer, chat_template))
        if len(prompts) == n:
            break
    return prompts


def heldout_prompts(cfg, tokenizer) -> list[list[int]]:
    """``bench.num_prompts`` prompts from ``bench.prompts``, rendered as extraction renders them."""
    return load_prompts(cfg.bench.prompts, tokenizer, cfg.bench.num_prompts,
                        chat_template=read_chat_template(cfg.extract.chat_template))
