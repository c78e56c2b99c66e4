"""Regeneration's sampling settings: typed in the config, sent as SGLang 0.5.23 reads them, and part of
the ``regenerated.jsonl`` cache key (answers sampled otherwise are never reused)."""

import json
import textwrap

import pytest

from eaglebox.config import ConfigError, load_config
from eaglebox.extract.dataset import Row
from eaglebox.extract.regenerate import CACHE, cache_key, regenerate, sampling_params

MINIMAL = """\
model:
  path: /models/llama
extract:
  regenerate: true
  regenerate_max_new_tokens: 48
"""


def config(tmp_path, *overrides):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(MINIMAL))
    return load_config(p, list(overrides))


def sglang_reads(params: dict):
    """What SGLang's tokenizer manager makes of a /generate request's ``sampling_params`` (the same
    class, constructor and verify call as ``TokenizerManager._create_tokenized_object``)."""
    from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

    sp = SamplingParams(**params)
    sp.verify(2048)
    return sp, TOP_K_ALL


def test_default_is_greedy_as_sglang_reads_it(tmp_path):
    params = sampling_params(config(tmp_path).extract)
    assert params["temperature"] == 0 and params["max_new_tokens"] == 48
    sp, _ = sglang_reads(params)
    assert sp.top_k == 1  # SGLang's greedy: temperature 0 becomes top-k 1
    assert sp.repetition_penalty == 1.0


def test_sampling_settings_reach_sglangs_sampling_params(tmp_path):
    cfg = config(tmp_path, "extract.regenerate_temperature=0.7", "extract.regenerate_top_p=0.9",
                 "extract.regenerate_top_k=40", "extract.regenerate_repetition_penalty=1.1")
    sp, _ = sglang_reads(sampling_params(cfg.extract))
    assert (sp.temperature, sp.top_p, sp.top_k, sp.repetition_penalty, sp.max_new_tokens) == (0.7, 0.9, 40, 1.1, 48)
    sp, top_k_all = sglang_reads(sampling_params(config(tmp_path, "extract.regenerate_temperature=1").extract))
    assert sp.temperature == 1 and sp.top_k == top_k_all  # top_k None: the whole vocabulary


@pytest.mark.parametrize("key,value", [("regenerate_temperature", "-0.1"), ("regenerate_top_p", "0"),
                                       ("regenerate_top_p", "1.5"), ("regenerate_top_k", "0"),
                                       ("regenerate_repetition_penalty", "3")])
def test_out_of_range_setting_is_one_error_naming_the_key(tmp_path, key, value):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, f"extract.{key}={value}")
    assert f"extract.{key}" in str(e.value)


def test_cached_answers_are_reused_only_under_the_same_sampling(tmp_path, tiny_target):
    """regenerate() keys its cache by the sampling settings: a cache written greedily serves a greedy
    rerun with no server at all, and a sampled rerun must ask the server again (here: none listening)."""
    from transformers import AutoTokenizer

    from eaglebox.extract import ExtractError
    from eaglebox.extract.http import Client

    tok = AutoTokenizer.from_pretrained(tiny_target)
    msgs = [{"role": "user", "content": "Repeat after me: hello there"},
            {"role": "assistant", "content": "hello there"}]
    rows = [Row(1, "a", messages=msgs)]
    out_dir = tmp_path / "out"
    greedy = config(tmp_path, f"extract.output_dir={out_dir}")
    sampled = config(tmp_path, f"extract.output_dir={out_dir}", "extract.regenerate_temperature=0.8")
    answer = [msgs[0], {"role": "assistant", "content": "hello there, cached"}]
    settings = {"sampling": sampling_params(greedy.extract), "chat_template": None}
    out_dir.mkdir()
    (out_dir / CACHE).write_text(json.dumps({"key": cache_key(msgs, settings), "messages": answer}) + "\n")
    nobody = Client("http://127.0.0.1:9", max_retries=0, backoff_s=0)  # discard port: connection refused

    assert regenerate(greedy.extract, rows, nobody, tok, out_dir, log=lambda *_: None)[0].messages == answer
    with pytest.raises(ExtractError, match="failed after 1 tries"):
        regenerate(sampled.extract, rows, nobody, tok, out_dir, log=lambda *_: None)
