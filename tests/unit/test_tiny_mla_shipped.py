"""The shipped tiny DeepSeek-V3 target: the one its recipe makes, with the files its stamp hashed."""

import copy
import json

from eaglebox_dev import tiny, tiny_mla


def test_shipped_mla_target_matches_the_code_recipe_and_its_stamped_file_hashes(tmp_path):
    assert tiny.shipped_ok(tiny_mla.SHIPPED, tiny_mla.RECIPE) is None
    out = tiny_mla.make_tiny_mla_target(tmp_path / "target", log=lambda *_: None)  # copied, not trained
    assert tiny.file_hashes(out) == tiny.file_hashes(tiny_mla.SHIPPED)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["kv_lora_rank"] == 256


def test_building_the_config_leaves_the_recipe_as_written():
    """transformers' config class adds keys to the rope_scaling dict it gets: were that RECIPE's own
    dict, every stamp would record another recipe and the target would be retrained each run."""
    from transformers import DeepseekV3Config

    before = copy.deepcopy(tiny_mla.RECIPE)
    DeepseekV3Config(**tiny_mla.target_config(tiny.train_tokenizer(tiny.conversations()["train"][:50], 300)))
    assert tiny_mla.RECIPE == before
