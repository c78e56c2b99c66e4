"""The shipped tiny target: it is the one its recipe makes (stamp), its files are the ones the stamp
hashed, `eaglebox tiny` copies it instead of training, and its greedy answers are varied."""

import json
import shutil

import pytest

from eaglebox_dev import tiny


def test_shipped_target_matches_the_code_recipe_and_its_stamped_file_hashes():
    stamp = json.loads((tiny.SHIPPED / tiny.STAMP).read_text())
    assert stamp["recipe"] == tiny.RECIPE
    assert stamp["recipe_sha256"] == tiny.recipe_hash(tiny.RECIPE)
    assert stamp["files"] == tiny.file_hashes(tiny.SHIPPED)
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(stamp["files"])
    assert tiny.shipped_ok() is None


def test_a_changed_recipe_or_file_is_not_taken_for_the_shipped_target(tmp_path, monkeypatch):
    copy = tmp_path / "shipped"
    shutil.copytree(tiny.SHIPPED, copy)
    assert tiny.shipped_ok(copy) is None
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text() + " ")
    assert "do not hash" in tiny.shipped_ok(copy)
    monkeypatch.setitem(tiny.RECIPE, "steps", tiny.RECIPE["steps"] + 1)
    assert "another recipe" in tiny.shipped_ok()


def test_make_tiny_target_copies_the_shipped_one_in_a_moment(tmp_path):
    import time

    t0 = time.monotonic()
    out = tiny.make_tiny_target(tmp_path / "target", log=lambda *_: None)
    assert time.monotonic() - t0 < 10
    assert tiny.file_hashes(out) == tiny.file_hashes(tiny.SHIPPED)
    assert tiny.is_current(out, tiny.RECIPE, log=lambda *_: None)
    paths = tiny.write_chat_data(tmp_path / "data")  # the task corpus goes with this target
    first = json.loads(paths["heldout"].read_text().splitlines()[0])
    assert first["messages"][0]["role"] == "user" and first["messages"][1]["role"] == "assistant"


@pytest.mark.timeout(600)
def test_shipped_target_greedy_answers_are_more_varied_than_recipe_3s():
    """The held-out prompts' greedy answers (HF transformers on the shipped weights, bf16 as served).

    A regression guard at what recipe 5 reaches (96 held-out prompts: 73 % distinct, 21 % dominated by a
    repeated n-gram; recipe 3's regenerated corpus had 34 % and 23 %). Issue 19's goal (>= 90 %
    distinct, no answer one phrase repeated) is NOT met yet: the model has not learned to copy from its
    prompt in 600 CPU steps."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from eaglebox.extract.diversity import answer_stats

    tok = AutoTokenizer.from_pretrained(tiny.SHIPPED)  # torch's threads: the lane's (make test's OMP_NUM_THREADS)
    model = LlamaForCausalLM.from_pretrained(tiny.SHIPPED, torch_dtype=torch.bfloat16).eval()
    convs = tiny.task_conversations()["heldout"][:96]
    answers = []
    for c in convs:
        ids = tok.apply_chat_template(c[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        answers.append(tok.decode(out[0, len(ids):], skip_special_tokens=True))
    stats = answer_stats(answers)
    assert stats["distinct_ratio"] >= 0.7, stats
    assert stats["repeated_ngram_dominant_share"] <= 0.22, stats
