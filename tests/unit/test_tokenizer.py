"""Every stage loads the tokenizer through ``target.tokenizer.load_tokenizer``, which runs a model's
own tokenizer code (Kimi-K2.5's tiktoken class) only when ``model.trust_remote_code`` says so."""

import json

import pytest
from tokenizers import Tokenizer, models

from conftest import config_for_model
from eaglebox.engine.launch import launch_args
from eaglebox.errors import EagleboxError
from eaglebox.target.tokenizer import load_tokenizer

CUSTOM = '''from transformers import PreTrainedTokenizerFast


class ShippedTokenizer(PreTrainedTokenizerFast):
    """Stands in for a tokenizer class shipped beside the weights (Kimi's TikTokenTokenizer)."""
'''


def custom_tokenizer_model(d):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(d / "tokenizer.json"))
    (d / "tokenization_shipped.py").write_text(CUSTOM)
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "ShippedTokenizer", "auto_map": {"AutoTokenizer": [None, "tokenization_shipped.ShippedTokenizer"]}}))
    return d


def test_custom_tokenizer_code_runs_only_when_trusted(tmp_path):
    model = custom_tokenizer_model(tmp_path / "m")
    with pytest.raises(EagleboxError, match=r"model.trust_remote_code: .*/m/tokenizer_config.json names a tokenizer "
                                            r"class shipped as code with the model \(auto_map\); set "
                                            r"model.trust_remote_code=true"):
        load_tokenizer(config_for_model(tmp_path, model).model)
    trusted = config_for_model(tmp_path, model, "model.trust_remote_code=true")
    assert type(load_tokenizer(trusted.model)).__name__ == "ShippedTokenizer"
    assert "--trust-remote-code" in launch_args(trusted, "plain")
    assert "--trust-remote-code" not in launch_args(config_for_model(tmp_path, model), "plain")


def test_no_stage_loads_a_tokenizer_another_way():
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "eaglebox"
    users = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if "AutoTokenizer" in p.read_text())
    assert users == ["target/tokenizer.py"]
