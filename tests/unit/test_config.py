import textwrap

import pytest

from eaglebox.config import ConfigError, dump_config, load_config

MINIMAL = """\
model:
  path: /models/llama
train:
  lr: 1.0e-4
  ttt_length: 7
"""


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_minimal_config_fills_defaults(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert str(cfg.model.path) == "/models/llama"
    assert cfg.train.ttt_length == 7 and cfg.train.loss_decay == 0.8
    assert cfg.capture.convention == "output_of_layer"


def test_missing_required_key_names_file_and_key(tmp_path):
    p = write(tmp_path, "train:\n  lr: 1.0e-4\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert f"{p}: missing: model: required key is missing" in str(e.value)


def test_unknown_key_names_line_and_dotted_path(tmp_path):
    p = write(tmp_path, MINIMAL + "  learning_rate: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert f"{p}: line 6: train.learning_rate: unknown key" in str(e.value)


def test_wrong_type_names_line(tmp_path):
    p = write(tmp_path, MINIMAL.replace("ttt_length: 7", "ttt_length: seven"))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert f"{p}: line 5: train.ttt_length:" in msg and "integer" in msg


def test_override_sets_nested_value_and_is_typed(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL), ["train.lr=5e-5", "capture.layer_ids=[1, 2, 3]",
                                                 "train.draft.draft_vocab_size=100"])
    assert cfg.train.lr == 5e-5
    assert cfg.capture.layer_ids == [1, 2, 3]
    assert cfg.train.draft.draft_vocab_size == 100


def test_bad_override_is_reported_as_override(tmp_path):
    p = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError, match=r"override 'train.lr=-1': train.lr: Input should be greater than 0"):
        load_config(p, ["train.lr=-1"])
    with pytest.raises(ConfigError, match=r"override 'train.nope=1': train.nope: unknown key"):
        load_config(p, ["train.nope=1"])
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(p, ["train.lr"])


def test_duplicate_key_is_an_error(tmp_path):
    p = write(tmp_path, MINIMAL + "  lr: 2.0e-4\n")
    with pytest.raises(ConfigError, match=r"line 6: duplicate key train.lr"):
        load_config(p)


def test_unknown_convention_is_rejected(tmp_path):
    p = write(tmp_path, MINIMAL + "capture:\n  convention: after_layer\n")
    with pytest.raises(ConfigError, match=r"line 7: capture.convention"):
        load_config(p)


def test_dump_round_trips(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL), ["serve.num_steps=5"])
    again = load_config(write(tmp_path, dump_config(cfg)))
    assert again == cfg


def test_every_shipped_config_validates():
    from pathlib import Path

    configs = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        load_config(path)
