"""A tiny Llama chat target, made from nothing on a CPU: tokenizer, weights and a chat data set.

Why it is trained at all: acceptance measured against a random target means nothing (its greedy
output is a two-token loop that any draft predicts). It is trained for a few minutes on two kinds
of conversation made from text on this machine: the ``chitchat-dataset`` package's dialogues, and
"continue this code" turns cut from the Python standard library's sources. On chat alone a target
this small answers everything with the same safe phrase; code makes its greedy continuations
depend on the prompt, so acceptance measured on it means something.

Everything is deterministic (fixed seeds, fixed thread count) and cached: a directory holding
``eaglebox-tiny.json`` with the same recipe is reused as it is.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

RECIPE = {
    "version": 3,
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "code_lines_prompt": 8,
    "code_lines_answer": 16,
    "seq_len": 256,
    "batch_size": 16,
    "steps": 400,
    "lr": 3e-3,
    "seed": 0,
}
HELDOUT = 200
"""The last conversations are never trained on, by the target nor the draft: they are the bench prompts."""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|begin_of_text|>", "<|end|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]


def chitchat_conversations() -> list[list[dict[str, str]]]:
    """All 7,168 dialogues as OpenAI-style message lists (speakers alternate user/assistant)."""
    import chitchat_dataset

    out = []
    for conv in chitchat_dataset.Dataset().values():
        msgs = []
        for turn in conv["messages"]:
            text = " ".join(u["text"].strip() for u in turn).strip()
            if text:
                msgs.append({"role": "user" if len(msgs) % 2 == 0 else "assistant", "content": text})
        if len(msgs) >= 2:
            out.append(msgs)
    return out


def code_conversations() -> list[list[dict[str, str]]]:
    """"Continue this code" turns: 8 non-blank lines of a stdlib module, then the next 16."""
    import sysconfig

    a, b = RECIPE["code_lines_prompt"], RECIPE["code_lines_answer"]
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for i in range(0, len(lines) - a - b, a + b):
            out.append([{"role": "user", "content": "\n".join(lines[i : i + a])},
                        {"role": "assistant", "content": "\n".join(lines[i + a : i + a + b])}])
    return out


def conversations() -> dict[str, list[list[dict[str, str]]]]:
    """``train`` and ``heldout`` splits, each chat and code interleaved in a fixed order."""
    import random

    chat, code = chitchat_conversations(), code_conversations()
    random.Random(RECIPE["seed"]).shuffle(code)
    h = HELDOUT // 2

    def mix(a, b):
        n = min(len(a), len(b))
        return [c for pair in zip(a, b) for c in pair] + a[n:] + b[n:]

    return {"train": mix(chat[:-h], code[:-h]), "heldout": mix(chat[-h:], code[-h:])}


def write_chat_data(out_dir: Path) -> dict[str, Path]:
    """Write ``train.jsonl`` (``messages`` format) and ``heldout.jsonl`` for extraction and bench.

    Each row is one exchange (a user turn and its answer): the bench measures first answers, and
    regenerating one answer per row is cheap on a CPU.
    """
    split = conversations()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": out_dir / "train.jsonl", "heldout": out_dir / "heldout.jsonl"}
    for name, rows in split.items():
        tmp = paths[name].with_suffix(".tmp")
        with open(tmp, "w") as f:
            for i, msgs in enumerate(rows):
                f.write(json.dumps({"id": f"tiny-{name}-{i}", "messages": msgs[:2]}) + "\n")
        tmp.replace(paths[name])
    return paths


def train_tokenizer(convs, vocab_size: int):
    """A byte-level BPE over the conversations' text, with :data:`SPECIAL` first and the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((m["content"] for c in convs for m in c), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0], eos_token=SPECIAL[1],
                                 pad_token=SPECIAL[2])
    hf.chat_template = CHAT_TEMPLATE
    return hf


def is_current(out: Path, recipe: dict, log=print) -> bool:
    """``out`` holds a target made from ``recipe`` (its ``eaglebox-tiny.json`` says so)."""
    stamp = Path(out) / "eaglebox-tiny.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("recipe") == recipe:
        log(f"tiny target: reusing {out}")
        return True
    return False


def token_stream(tok, convs):
    """Every conversation rendered by the chat template, concatenated: the language-model corpus."""
    import torch

    ids = []
    for c in convs:
        ids.extend(tok.apply_chat_template(c, tokenize=True, return_dict=False))
    return torch.tensor(ids, dtype=torch.long)


def train_lm(model, data, recipe: dict, *, log=print) -> float:
    """Next-token training on random windows of ``data`` (``recipe``: steps, seq_len, batch_size, lr,
    seed); AdamW with one-cycle LR, gradients clipped at 1. Returns the last step's loss."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
    steps, T, B = recipe["steps"], recipe["seq_len"], recipe["batch_size"]
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe["lr"], total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(recipe["seed"])
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
        batch = torch.stack([data[s : s + T + 1] for s in starts])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"tiny target: step {step + 1}/{steps} loss {loss.item():.3f}")
    return loss.item()


def publish(out: Path, recipe: dict, write, *, t0: float, final_loss: float, log=print) -> Path:
    """Write the target into a temporary sibling (``write(dir)``), stamp it with ``recipe`` and move it
    to ``out`` in one rename, so an interrupted run never leaves a directory that looks current."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    for f in tmp.iterdir():  # readable by the container user too (the weights are written 0600)
        f.chmod(0o644)
    (tmp / "eaglebox-tiny.json").write_text(json.dumps(
        {"recipe": recipe, "final_loss": round(final_loss, 4), "train_s": round(time.monotonic() - t0, 1)},
        indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    log(f"tiny target: wrote {out} in {time.monotonic() - t0:.0f} s (final loss {final_loss:.3f})")
    return out


def make_tiny_target(out: Path, *, log=print) -> Path:
    """Create (or reuse) the tiny target in ``out``; returns ``out``."""
    out = Path(out)
    if is_current(out, RECIPE, log):
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    torch.manual_seed(RECIPE["seed"])
    torch.set_num_threads(2)
    convs = conversations()["train"]
    tok = train_tokenizer(convs, RECIPE["vocab_size"])
    data = token_stream(tok, convs)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=RECIPE["hidden_size"], intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"], num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"], max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    loss = train_lm(model, data, RECIPE, log=log)

    def write(d: Path) -> None:
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)

    return publish(out, RECIPE, write, t0=t0, final_loss=loss, log=log)
