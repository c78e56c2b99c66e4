"""The stdlib code corpus (``eaglebox_dev.code_corpus``), built for real from 60 stdlib files: held out
by file, read by the extractor and the bench as they are, its tokenizer byte-exact with single-token
role markers and the tiny target's template, its manifest true to its files, and the build repeatable;
and the installed packages' windows added to it (``--site-of``), filtered and held out the same way."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from conftest import config_for_model
from eaglebox.extract.dataset import BadRow, prompt_ids, read_rows, tokenize
from eaglebox.extract.prompts import heldout_prompts
from eaglebox.target.tokenizer import load_tokenizer
from eaglebox_dev import code_corpus, tiny

MAX_FILES = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("code-corpus")
    assert code_corpus.main(["--out", str(out), "--max-files", str(MAX_FILES)]) == 0
    return out


def manifest(out: Path) -> dict:
    return json.loads((out / "corpus-manifest.json").read_text())


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def source_file(row: dict) -> str:
    return row["id"].rsplit(":", 1)[0]


def test_no_file_is_on_both_sides(corpus):
    m = manifest(corpus)
    train = {source_file(r) for r in rows(corpus / "train.jsonl")}
    held = {source_file(r) for r in rows(corpus / "heldout.jsonl")}
    assert held and train and not held & train
    assert held == set(m["heldout_files"])
    assert all(code_corpus.is_heldout(p) for p in held) and not any(code_corpus.is_heldout(p) for p in train)
    assert (len(train), len(held)) == (m["files"]["train"], m["files"]["heldout"])
    assert len(train) + len(held) == MAX_FILES


def test_the_extractor_and_the_bench_read_every_row_as_the_manifest_counts_it(corpus, tmp_path):
    m = manifest(corpus)
    tok = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    for side in ("train", "heldout"):
        read = list(read_rows(corpus / f"{side}.jsonl", "messages"))
        assert not [r for r in read if isinstance(r, BadRow)]
        assert len(read) == m[side]["rows"]
        masks = [tokenize(r, tok)[1] for r in read]  # checks the template's prefix property too
        assert sum(map(sum, masks)) == m[side]["answer_tokens"]
        assert sum(len(prompt_ids(r, tok)) for r in read) == m[side]["prompt_tokens"]
    n = m["heldout"]["rows"]
    cfg = config_for_model(tmp_path, corpus / "tokenizer", f"bench.prompts={corpus / 'heldout.jsonl'}",
                           f"bench.num_prompts={n}")
    prompts = heldout_prompts(cfg, load_tokenizer(cfg.model))
    assert len(prompts) == n and all(p[0] == tok.bos_token_id and p[-1] == tok.convert_tokens_to_ids(
        "<|assistant|>") for p in prompts)


def test_the_tokenizer_round_trips_code_byte_for_byte(corpus):
    tok = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    files, _ = code_corpus.source_files(code_corpus.stdlib_root())
    texts = [files[p] for p in manifest(corpus)["heldout_files"]]
    texts += [next(t for t in files.values() if not t.isascii()),
              "def f():\r\n\treturn 'caf\u00e9 \U0001f600'  \n\f\n\x00\v\u2028"]
    for text in texts:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_the_chat_template_is_the_tiny_targets_with_single_token_role_markers(corpus):
    tok = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    shipped = tiny.SHIPPED
    assert (corpus / "tokenizer" / "chat_template.jinja").read_text() == (shipped / "chat_template.jinja").read_text()
    ours = json.loads((corpus / "tokenizer" / "tokenizer_config.json").read_text())
    assert ours == json.loads((shipped / "tokenizer_config.json").read_text())
    marker = {s: tok.convert_tokens_to_ids(s) for s in tiny.SPECIAL}
    assert list(marker.values()) == list(range(len(tiny.SPECIAL)))
    assert all(tok.encode(s, add_special_tokens=False) == [i] for s, i in marker.items())
    conv = rows(corpus / "heldout.jsonl")[0]["messages"]
    ids = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
    assert ids[:2] == [tok.bos_token_id, marker["<|user|>"]] and ids[-1] == marker["<|end|>"]
    assert ids.count(marker["<|assistant|>"]) == 1
    assert tok.decode(ids) == tok.bos_token + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in conv)


def test_windows_are_whole_lines_that_tile_their_file(corpus):
    files, _ = code_corpus.source_files(code_corpus.stdlib_root())
    by_file: dict[str, list[dict]] = {}
    for r in rows(corpus / "train.jsonl"):
        by_file.setdefault(source_file(r), []).append(r)
    covered = 0
    for path, rs in by_file.items():
        text = "".join(r["messages"][0]["content"].split("\n", 1)[1] + r["messages"][1]["content"]
                       for r in sorted(rs, key=lambda r: int(r["id"].rsplit(":", 1)[1])))
        assert files[path].startswith(text)  # from line 1, in order, no gap, no overlap
        covered += len(text)
    assert covered > 0.97 * sum(len(files[p]) for p in by_file)  # but short tails


def test_the_manifest_hashes_its_files_and_a_rebuild_is_identical(corpus, tmp_path):
    m = manifest(corpus)
    for name, sha in m["sha256"].items():
        assert hashlib.sha256((corpus / name).read_bytes()).hexdigest() == sha
    again = code_corpus.build(tmp_path / "again", max_files=MAX_FILES)
    assert again["sha256"] == m["sha256"]
    assert (tmp_path / "again" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (corpus / "tokenizer" / "tokenizer.json").read_bytes()


def test_installed_files_give_more_train_windows_held_out_and_filtered(corpus, tmp_path):
    """``--site-of`` over a folder of installed files: windows cut with the corpus's own tokenizer; a held-out
    path, a tests folder, a generated header, a path the corpus has, a text already taken, a copy of the
    held-out rows and a window one long line puts over its tokens are not taken; ``--max-rows`` bounds the
    rows; a manifest older than ``train_files`` is refused in one error."""
    m = manifest(corpus)
    held_lines = code_corpus.long_lines(x["content"] for r in rows(corpus / "heldout.jsonl") for x in r["messages"])
    files, _ = code_corpus.source_files(code_corpus.stdlib_root())
    texts = [t for p, t in files.items() if not code_corpus.SITE_GENERATED.search(t[:code_corpus.HEADER_CHARS])
             and len(code_corpus.long_lines([t]) & held_lines) < code_corpus.COPY_LINES][:8]
    root = tmp_path / "site-packages"
    placed = {**{f"pkg/mod{i}.py": texts[i] for i in range(4)},
              "pkg/mod25.py": texts[4],  # held out by its path's hash
              "pkg/tests/test_mod.py": texts[5],
              "pkg/generated.py": "# This file is autogenerated; do not edit.\n" + texts[6],
              "pkg/copy.py": texts[0],
              m["train_files"][0]: texts[7],
              "pkg/vendored.py": texts[7] + rows(corpus / "heldout.jsonl")[0]["messages"][1]["content"],
              "pkg/data.py": texts[3].replace("\n", "\nTABLE = [" + ", ".join(map(str, range(2000))) + "]\n", 1)}
    assert code_corpus.is_heldout("pkg/mod25.py") and not any(map(code_corpus.is_heldout, ["pkg/copy.py", "pkg/generated.py"]))
    for rel, text in placed.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    out = tmp_path / "site"
    assert code_corpus.main(["--out", str(out), "--site-of", str(corpus), "--root", str(root), "--max-rows", "10000"]) == 0
    site = json.loads((out / "site-manifest.json").read_text())
    assert site["files"]["skipped"] == {"heldout": 1, "generated_header": 1, "duplicate_text": 1,
                                        "duplicate_path": 1, "heldout_copy": 1}
    got = rows(out / "site.jsonl")
    by_file: dict[str, list[dict]] = {}
    for r in got:
        by_file.setdefault(source_file(r), []).append(r)
    assert site["windows_over_their_tokens"] == 1
    assert len(by_file) == site["files"]["taken"] == 5 and len(by_file.keys() & {"pkg/mod0.py", "pkg/copy.py"}) == 1
    tok = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    read = list(read_rows(out / "site.jsonl", "messages"))
    assert len(read) == site["site"]["rows"] == len(got)
    assert sum(sum(tokenize(r, tok)[1]) for r in read) == site["site"]["answer_tokens"]
    for path, rs in by_file.items():
        text = "".join(r["messages"][0]["content"].split("\n", 1)[1] + r["messages"][1]["content"]
                       for r in sorted(rs, key=lambda r: int(r["id"].rsplit(":", 1)[1])))
        assert "TABLE = [" not in text and (path == "pkg/data.py" or placed[path].startswith(text))
    code_corpus.build_site(tmp_path / "few", corpus, [root], max_rows=3)
    assert len(rows(tmp_path / "few" / "site.jsonl")) == 3
    old = tmp_path / "old"
    shutil.copytree(corpus, old)
    (old / "corpus-manifest.json").write_text(json.dumps({k: v for k, v in m.items() if k != "train_files"}))
    with pytest.raises(SystemExit, match="names no train_files"):
        code_corpus.build_site(tmp_path / "x", old, [root], max_rows=3)
