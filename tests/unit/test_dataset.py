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
