"""A tiny Llama chat target, made from nothing on a CPU: tokenizer, weights and a chat data set.

Why it is trained at all: acceptance measured against a random target means nothing (its greedy
output is a two-token loop that any draft predicts). Why on *tasks*: trained on free chat alone
(recipe 3: ``chitchat-dataset`` dialogues and "continue this code" turns), a target this small
answers most prompts with the same safe phrase or loops on it ("I'm not sure I'm not sure ...": of
512 regenerated answers 181 were distinct and 23 % were one phrase repeated), and a draft that learns
the loop scores a high acceptance length that says nothing. So most of its conversations are
tasks whose answer is a function of the prompt, written in the chat data set's own sentences and the
Python standard library's code (:func:`task_conversations`): repeat a sentence, say two lines in the
other order, answer a question from the facts in the prompt, make a numbered list, copy code; plus
a share of real chit-chat exchanges. Its greedy answers are then varied, end with ``<|end|>`` and
are predictable only by a draft that reads the prompt (what a draft of a real chat model does).

The trained target is shipped in the package (:data:`SHIPPED`: safetensors, tokenizer, and a stamp
with the recipe, the recipe's hash and every file's sha256), so ``eaglebox tiny`` copies it in a
second instead of training for ten minutes on a 2-core machine. ``python -m eaglebox_dev.tiny
--retrain`` remakes it from :data:`RECIPE` (deterministic: fixed seeds, fixed thread count) and
replaces the shipped copy; a unit test checks that the shipped stamp records this module's recipe
hash and that the files hash to what it records.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from pathlib import Path

RECIPE = {
    "version": 5,
    "corpus": "tasks-v4",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "conversations": 30000,
    "task_weights": {"repeat": 0.3, "swap": 0.12, "facts": 0.2, "list": 0.15, "code": 0.15, "chat": 0.08},
    "code_lines": 4,
    "seq_len": 256,
    "batch_size": 16,
    "steps": 600,
    "lr": 3e-3,
    "seed": 0,
    "threads": 1,
    "loss": "answers",
}
"""``loss``: next-token loss on the answers' tokens only (each window's prompt tokens are context, not
targets): trained on every token, 600 steps did not teach the model to copy from its prompt (recipe 4:
51 % distinct answers), the prompts' chat text taking most of the gradient; with it, 63 %. (A variant
with 900 steps of 128-token windows at lr 6e-3, each starting at a conversation, reached 61 %.) ``threads``: one, for determinism and speed: two OpenMP threads on a machine whose 2 cores are busy
spin at every barrier (measured: 5-7x slower per step than one thread)."""
LEGACY_RECIPE = {
    "version": 3, "vocab_size": 2048, "code_lines_prompt": 8, "code_lines_answer": 16, "seed": 0,
}
"""What the chat + code corpus (recipe 3, :func:`conversations`) reads; the tiny DeepSeek-V3 target
(:mod:`eaglebox_dev.tiny_mla`) is still trained on it."""
HELDOUT = 200
"""The last conversations are never trained on, by the target nor the draft: they are the bench prompts."""
SHIPPED = Path(__file__).parent / "assets" / "tiny-target"
"""The trained target as the package ships it (see the module docstring)."""
STAMP = "eaglebox-tiny.json"

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

    a, b = LEGACY_RECIPE["code_lines_prompt"], LEGACY_RECIPE["code_lines_answer"]
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for i in range(0, len(lines) - a - b, a + b):
            out.append([{"role": "user", "content": "\n".join(lines[i : i + a])},
                        {"role": "assistant", "content": "\n".join(lines[i + a : i + a + b])}])
    return out


def conversations() -> dict[str, list[list[dict[str, str]]]]:
    """Recipe 3's corpus (the tiny DeepSeek-V3 target's): ``train`` and ``heldout`` splits, each chat and
    code interleaved in a fixed order."""
    chat, code = chitchat_conversations(), code_conversations()
    random.Random(LEGACY_RECIPE["seed"]).shuffle(code)
    h = HELDOUT // 2

    def mix(a, b):
        n = min(len(a), len(b))
        return [c for pair in zip(a, b) for c in pair] + a[n:] + b[n:]

    return {"train": mix(chat[:-h], code[:-h]), "heldout": mix(chat[-h:], code[-h:])}


NAMES = ("Ana Ben Carl Dora Eli Fay Gus Hana Ivan June Kai Lena Milo Nora Omar Pia Quinn Rosa Sam Tara "
         "Uma Vic Wes Xena Yuri Zoe Alma Boris Cleo Dev Edda Finn Gwen Hugo Iris Jack Kira Leo Mara Nils").split()
COLORS = "red blue green yellow black white orange purple brown gray pink silver".split()
THINGS = ("car bike boat kite lamp chair hat coat bag clock cup desk drum guitar phone radio sofa tent "
          "watch ball").split()
PLACES = ("Paris Oslo Lima Cairo Tokyo Rome Berlin Boston Denver Dublin Madrid Nairobi Quito Seoul Sydney "
          "Toronto Vienna Warsaw Zurich Austin").split()


def _sentences(dialogues) -> list[str]:
    """The dialogues' utterances of 4 to 24 words (ASCII), deduplicated, in order."""
    seen, out = set(), []
    for conv in dialogues:
        for turn in conv["messages"]:
            for u in turn:
                text = " ".join(u["text"].split())
                if 4 <= len(text.split()) <= 24 and text.isascii() and text not in seen:
                    seen.add(text)
                    out.append(text)
    return out


def _chat(dialogues) -> list[tuple[str, str]]:
    """Each dialogue's first exchange (user turn, answer), both under 40 words."""
    out = []
    for conv in dialogues:
        turns = [" ".join(" ".join(u["text"].split()) for u in turn) for turn in conv["messages"][:2]]
        if len(turns) == 2 and all(0 < len(t.split()) < 40 and t.isascii() for t in turns):
            out.append((turns[0], turns[1]))
    return out


def _code_blocks(paths) -> list[str]:
    """Runs of ``code_lines`` non-blank lines (each under 80 characters) of stdlib modules."""
    n = RECIPE["code_lines"]
    out = []
    for path in paths:
        lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for i in range(0, len(lines) - n, n):
            block = lines[i : i + n]
            if all(len(line) < 80 for line in block) and all(line.isascii() for line in block):
                out.append("\n".join(block))
    return out


def _task(kind: str, rng: random.Random, pools: dict) -> list[dict[str, str]]:
    """One conversation of ``kind`` (see :data:`RECIPE`'s task weights): a user turn and its answer."""
    sent = pools["sentences"]
    if kind == "repeat":
        s = rng.choice(sent)
        user, answer = f"Repeat after me: {s}", s
    elif kind == "swap":
        a, b = rng.choice(sent), rng.choice(sent)
        user, answer = f"Say these two lines in the other order:\n{a}\n{b}", f"{b}\n{a}"
    elif kind == "facts":
        people = rng.sample(NAMES, 2)
        facts = {p: (rng.choice(COLORS), rng.choice(THINGS), rng.choice(PLACES)) for p in people}
        text = " ".join(f"{p} has a {c} {t} and lives in {pl}." for p, (c, t, pl) in facts.items())
        p = rng.choice(people)
        c, t, pl = facts[p]
        question, answer = rng.choice([(f"Where does {p} live?", f"{p} lives in {pl}."),
                                       (f"What color is the {t} of {p}?", f"The {t} of {p} is {c}."),
                                       (f"What does {p} have?", f"{p} has a {c} {t}.")])
        user = f"{text} {question}"
    elif kind == "list":
        items = rng.sample(pools["words"], rng.randint(3, 6))
        user = f"Make a numbered list of: {', '.join(items)}"
        answer = "\n".join(f"{i + 1}. {w}" for i, w in enumerate(items))
    elif kind == "code":
        block = rng.choice(pools["code"])
        user, answer = f"Copy this code:\n{block}", block
    else:
        user, answer = rng.choice(pools["chat"])
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def task_conversations() -> dict[str, list[list[dict[str, str]]]]:
    """The tiny target's corpus (recipe 4): ``train`` (``RECIPE["conversations"]``) and ``heldout``
    (:data:`HELDOUT`) conversations, task kinds drawn by ``RECIPE["task_weights"]`` in a fixed order.
    The held-out ones are made from other dialogues' sentences, other modules' code and another seed."""
    import re
    import sysconfig
    from collections import Counter

    import chitchat_dataset

    dialogues = list(chitchat_dataset.Dataset().values())
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    cut_d, cut_m = len(dialogues) - 400, len(modules) - 20
    kinds, weights = zip(*RECIPE["task_weights"].items())
    out = {}
    for name, dia, mods, n, seed in (("train", dialogues[:cut_d], modules[:cut_m], RECIPE["conversations"], 0),
                                      ("heldout", dialogues[cut_d:], modules[cut_m:], HELDOUT, 1)):
        sentences = _sentences(dia)
        counts = Counter(w.lower() for s in sentences for w in re.findall(r"[A-Za-z]{4,10}", s))
        pools = {"sentences": sentences, "chat": _chat(dia), "code": _code_blocks(mods),
                 "words": sorted(w for w, _ in counts.most_common(1500))}
        rng = random.Random(RECIPE["seed"] * 1000 + seed)
        out[name] = [_task(rng.choices(kinds, weights)[0], rng, pools) for _ in range(n)]
    return out


def corpus_for(target: Path) -> tuple[str, object]:
    """(name, function) of the corpus that goes with the target in ``target``: recipe 4's tasks, or
    recipe 3's chat and code for a target whose stamp names no corpus (the tiny DeepSeek-V3 target's)."""
    stamp = Path(target) / STAMP
    recipe = json.loads(stamp.read_text())["recipe"] if stamp.exists() else RECIPE
    if recipe.get("corpus") == RECIPE["corpus"]:
        return RECIPE["corpus"], task_conversations
    return "chat-code-v3", conversations


DATA_STAMP = "eaglebox-data.json"


def data_current(out_dir: Path) -> bool:
    """``out_dir`` holds the chat data of the corpus that goes with the target beside it."""
    stamp = Path(out_dir) / DATA_STAMP
    return (stamp.exists() and (Path(out_dir) / "heldout.jsonl").exists()
            and json.loads(stamp.read_text()).get("corpus") == corpus_for(Path(out_dir).parent / "target")[0])


def write_chat_data(out_dir: Path) -> dict[str, Path]:
    """Write ``train.jsonl`` (``messages`` format) and ``heldout.jsonl`` for extraction and bench, from
    the corpus that goes with the target beside ``out_dir`` (:func:`corpus_for`), and a stamp naming it.

    Each row is one exchange (a user turn and its answer): the bench measures first answers, and
    regenerating one answer per row is cheap on a CPU.
    """
    out_dir = Path(out_dir)
    name, corpus = corpus_for(out_dir.parent / "target")
    split = corpus()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": out_dir / "train.jsonl", "heldout": out_dir / "heldout.jsonl"}
    for split_name, rows in split.items():
        tmp = paths[split_name].with_suffix(".tmp")
        with open(tmp, "w") as f:
            for i, msgs in enumerate(rows):
                f.write(json.dumps({"id": f"tiny-{split_name}-{i}", "messages": msgs[:2]}) + "\n")
        tmp.replace(paths[split_name])
    (out_dir / DATA_STAMP).write_text(json.dumps({"corpus": name}) + "\n")
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


def recipe_hash(recipe: dict) -> str:
    """sha256 of the recipe's canonical JSON: what a stamp records and the shipped-target test compares."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def file_hashes(d: Path) -> dict[str, str]:
    """sha256 of every file in ``d`` but the stamp, by name."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(Path(d).iterdir())
            if f.is_file() and f.name != STAMP}


def is_current(out: Path, recipe: dict, log=print) -> bool:
    """``out`` holds a target made from ``recipe`` (its ``eaglebox-tiny.json`` says so)."""
    stamp = Path(out) / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("recipe") == recipe:
        log(f"tiny target: reusing {out}")
        return True
    return False


def shipped_ok(src: Path = SHIPPED, recipe: dict | None = None) -> str | None:
    """None when ``src`` holds the target of ``recipe`` (default :data:`RECIPE`) with the files its stamp
    records, else why not."""
    recipe = RECIPE if recipe is None else recipe
    stamp = Path(src) / STAMP
    if not stamp.exists():
        return f"{stamp} is missing"
    st = json.loads(stamp.read_text())
    if st.get("recipe_sha256") != recipe_hash(recipe) or st.get("recipe") != recipe:
        return f"{stamp} records another recipe than the code's"
    if st.get("files") != file_hashes(src):
        return f"{src}: its files do not hash to what {stamp} records"
    return None


def token_stream(tok, convs):
    """Every conversation rendered by the chat template, concatenated: the language-model corpus."""
    import torch

    ids = []
    for c in convs:
        ids.extend(tok.apply_chat_template(c, tokenize=True, return_dict=False))
    return torch.tensor(ids, dtype=torch.long)


def answer_stream(tok, convs):
    """(ids, mask, starts): every conversation rendered by the chat template, concatenated, and a mask that is
    True on the answers' tokens (after ``<|assistant|>``, its ``<|end|>`` included)."""
    import torch

    ids, mask, starts = [], [], []
    for c in convs:
        starts.append(len(ids))
        full = tok.apply_chat_template(c, tokenize=True, return_dict=False)
        n = len(tok.apply_chat_template(c[:1], add_generation_prompt=True, tokenize=True, return_dict=False))
        ids.extend(full)
        mask.extend([False] * n + [True] * (len(full) - n))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool), torch.tensor(starts)


def train_lm(model, data, recipe: dict, *, mask=None, starts=None, device: str = "cpu", log=print) -> float:
    """Next-token training on random windows of ``data`` (``recipe``: steps, seq_len, batch_size, lr,
    seed); AdamW with one-cycle LR, gradients clipped at 1. With ``mask`` (as ``data``), only the tokens
    it marks are targets; with ``starts`` (offsets into ``data``), windows begin only there. On a GPU
    (``device``, where ``model`` is) under bf16 autocast: the H200 checks' wide targets. Returns the
    last step's loss."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
    steps, T, B = recipe["steps"], recipe["seq_len"], recipe["batch_size"]
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe["lr"], total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(recipe["seed"])
    model.train()
    for step in range(steps):
        if starts is None:
            at = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
        else:
            at = starts[torch.randint(0, len(starts) - 64, (B,), generator=gen)]  # the last ones lack T tokens after
        batch = torch.stack([data[s : s + T + 1] for s in at]).to(device)
        labels = batch[:, :-1]
        if mask is not None:
            labels = labels.masked_fill(~torch.stack([mask[s : s + T] for s in at]).to(device), -100)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device != "cpu"):
            loss = model(input_ids=batch[:, :-1], labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"tiny target: step {step + 1}/{steps} loss {loss.item():.3f}")
    return loss.item()


def publish(out: Path, recipe: dict, write, *, t0: float, final_loss: float, log=print) -> Path:
    """Write the target into a temporary sibling (``write(dir)``), stamp it with ``recipe``, its hash and
    every file's sha256, and move it to ``out`` in one rename, so an interrupted run never leaves a
    directory that looks current."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    for f in tmp.iterdir():  # readable by the container user too (the weights are written 0600)
        f.chmod(0o644)
    (tmp / STAMP).write_text(json.dumps(
        {"recipe": recipe, "recipe_sha256": recipe_hash(recipe), "files": file_hashes(tmp),
         "final_loss": round(final_loss, 4), "train_s": round(time.monotonic() - t0, 1)}, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    log(f"tiny target: wrote {out} in {time.monotonic() - t0:.0f} s (final loss {final_loss:.3f})")
    return out


def copy_shipped(out: Path, src: Path = SHIPPED, *, log=print) -> Path:
    """Copy the shipped target ``src`` into ``out`` (through a temporary sibling and one rename)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    log(f"tiny target: copied the shipped target to {out}")
    return out


def make_tiny_target(out: Path, *, retrain: bool = False, log=print) -> Path:
    """Create (or reuse) the tiny target in ``out``; returns ``out``. The shipped target is copied when it
    matches :data:`RECIPE` (:func:`shipped_ok`); otherwise, or with ``retrain``, it is trained."""
    out = Path(out)
    if not retrain:
        if is_current(out, RECIPE, log):
            return out
        why = shipped_ok()
        if why is None:
            return copy_shipped(out, log=log)
        log(f"tiny target: not using the shipped target ({why}); training it (minutes)")
    return train_tiny_target(out, log=log)


def train_tiny_target(out: Path, *, log=print) -> Path:
    """Train the target of :data:`RECIPE` into ``out`` (about ten minutes on 2 cores); returns ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    torch.manual_seed(RECIPE["seed"])
    torch.set_num_threads(RECIPE["threads"])
    convs = task_conversations()["train"]
    tok = train_tokenizer(convs, RECIPE["vocab_size"])
    data, mask, _ = answer_stream(tok, convs)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=RECIPE["hidden_size"], intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"], num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"], max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    loss = train_lm(model, data, RECIPE, mask=mask, log=log)

    def write(d: Path) -> None:
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)

    return publish(out, RECIPE, write, t0=t0, final_loss=loss, log=log)


def retrain_cli(argv: list[str] | None, module: str, train, shipped: Path, recipe: dict) -> int:
    """``python -m <module> --retrain``: ``train(shipped)`` remakes the shipped target from ``recipe``,
    which must then check out (:func:`shipped_ok`)."""
    import argparse

    p = argparse.ArgumentParser(prog=f"python -m {module}", description=f"remake the shipped target of {module}")
    p.add_argument("--retrain", action="store_true", required=True,
                   help=f"train the target and replace the shipped copy ({shipped})")
    p.parse_args(argv)
    train(shipped)
    why = shipped_ok(shipped, recipe)
    if why is not None:
        raise SystemExit(f"retrained target does not check out: {why}")
    print(f"tiny target: shipped copy remade in {shipped}; commit it")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m eaglebox_dev.tiny --retrain``: remake the shipped target from :data:`RECIPE`."""
    return retrain_cli(argv, "eaglebox_dev.tiny", train_tiny_target, SHIPPED, RECIPE)


if __name__ == "__main__":
    raise SystemExit(main())
