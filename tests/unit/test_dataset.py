import json

import pytest
from transformers import AutoTokenizer

from eaglebox.extract.dataset import BadRow, Row, read_rows, tokenize


def write_lines(tmp_path, lines):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_formats_are_detected_and_bad_rows_carry_line_numbers(tmp_path):
    p = write_lines(tmp_path, [
        json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}),
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
        json.dumps({"text": "plain text"}),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        json.dumps({"prompt": "no known field"}),
        json.dumps({"messages": [{"role": "user"}]}),
    ])
    rows = list(read_rows(p))
    assert [type(r).__name__ for r in rows] == ["Row"] * 3 + ["BadRow"] * 5
    assert rows[0].messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert rows[2].text == "plain text"
    msgs = [str(r) for r in rows[3:]]
    assert msgs[0].startswith(f"{p}: line 4: not valid JSON")
    assert msgs[1] == f"{p}: line 5: empty conversation: no non-empty assistant turn"
    assert msgs[2] == f"{p}: line 6: messages[0]: unknown role 'robot'"
    assert msgs[3] == f"{p}: line 7: no 'conversations', 'messages' or 'text' field"
    assert msgs[4] == f"{p}: line 8: messages[0]: content is missing or not a string"


def test_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "one"}, {"text": ""}]), p)
    rows = list(read_rows(p, "text"))
    assert rows[0].text == "one" and isinstance(rows[1], BadRow) and rows[1].line == 2


def test_loss_mask_covers_exactly_the_assistant_turns(tiny_target):
    tok = AutoTokenizer.from_pretrained(tiny_target)
    msgs = [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": "fine thanks"},
            {"role": "user", "content": "good"}, {"role": "assistant", "content": "yes"}]
    ids, mask = tokenize(Row(1, "x", messages=msgs), tok)
    assert len(ids) == len(mask)
    masked = tok.decode([i for i, m in zip(ids, mask) if m])
    assert masked == "fine thanks<|end|>yes<|end|>"
    assert ids == tok.apply_chat_template(msgs, tokenize=True, return_dict=False)


def test_template_that_is_not_prefix_stable_is_refused(tiny_target):
    tok = AutoTokenizer.from_pretrained(tiny_target)
    # renders the number of messages first: a prefix does not render as a prefix
    template = "{{ messages|length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(ValueError, match="prefix"):
        tokenize(Row(1, "x", messages=msgs), tok, template)


def test_real_world_corpus_defects_are_bad_rows_or_read(tmp_path):
    """A BOM, a bad UTF-8 byte, OpenAI content parts, a non-text part and an over-long line."""
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": "c"}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                          {"role": "assistant", "content": "c"}]}
    huge = {"text": "x" * 5000}
    p = tmp_path / "d.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(ok).encode() + b"\n" + b'{"text": "caf\xe9"}\n'
                  + json.dumps(parts).encode() + b"\n" + json.dumps(image).encode() + b"\n"
                  + json.dumps(huge).encode() + b"\n")
    rows = list(read_rows(p, max_bytes=1000))
    assert [type(r).__name__ for r in rows] == ["Row", "BadRow", "Row", "BadRow", "BadRow"]
    assert rows[0].messages == ok["messages"]
    line1 = len(json.dumps(ok)) + 4  # BOM + newline
    assert str(rows[1]) == f"{p}: line 2: not valid UTF-8 (byte {line1 + 13:,} of the file: b'\\xe9')"
    assert rows[2].messages[0] == {"role": "user", "content": "a b"}
    assert str(rows[3]) == f"{p}: line 4: messages[0].content[0]: a 'image_url' part; only text parts can be captured"
    assert str(rows[4]) == f"{p}: line 5: {len(json.dumps(huge)) + 1:,} bytes, over extract.max_row_bytes=1,000"


def test_extraction_regeneration_and_bench_render_one_conversation_alike(tiny_target, tmp_path):
    """A configured chat template reaches all three: the prompt the bench sends and the one regeneration
    sends are the prefix extraction captures."""
    from eaglebox.extract.dataset import render_chat
    from eaglebox.extract.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(tiny_target)
    template = ("{% for m in messages %}[{{ m['role'] }}]\n{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant]\n{% endif %}")
    msgs = [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": "fine"}]
    p = write_lines(tmp_path, [json.dumps({"messages": msgs})])
    bench = load_prompts(p, tok, 1, chat_template=template)[0]
    regen = render_chat(tok, msgs[:1], template, generation_prompt=True)  # what regenerate() sends
    ids, mask = tokenize(Row(1, "x", messages=msgs), tok, template)
    assert bench == regen == ids[: mask.index(1)]
    assert tok.decode(bench) == "[user]\nhow are you\n[assistant]\n"
    assert bench != load_prompts(p, tok, 1)[0]  # the tokenizer's own template renders otherwise


def test_regeneration_cache_key_follows_content_not_line():
    from eaglebox.extract.regenerate import cache_key

    a = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}]
    b = [{"role": "user", "content": "b"}, {"role": "assistant", "content": "x"}]
    settings = {"sampling": {"max_new_tokens": 8, "temperature": 0}, "chat_template": None}
    assert cache_key(a, settings) == cache_key([dict(m) for m in a], dict(settings))
    assert len({cache_key(a, settings), cache_key(b, settings),
                cache_key(a, {**settings, "sampling": {"max_new_tokens": 9, "temperature": 0}}),
                cache_key(a, {**settings, "chat_template": "{{ messages }}"})}) == 4
