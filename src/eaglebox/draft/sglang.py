"""Write the draft as the HF-style directory SGLang 0.5.23 loads as ``LlamaForCausalLMEagle3``.

``config.json`` names only keys SGLang reads; options it would silently ignore (``norm_before_residual``,
``norm_before_fc``, ``fc_norm``, ``norm_output``, biases, several layers) are never written, and
:func:`check_export` refuses a directory that has them. An ``eaglebox`` block records where the
features came from (engine, version, the ids SGLang was given and the layers it hooked, the target's
fingerprint, the engine options, data manifest digest): serving compares it with the target before
it starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglebox.draft.spec import DraftSpec
from eaglebox.errors import EagleboxError
from eaglebox.shards.format import ShardReader, manifest_digest

SERVING_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}
"""Exactly what SGLang's loader maps onto the model (``midlayer`` -> ``layers.0``); nothing else."""

IGNORED_BY_SGLANG = ("norm_before_residual", "norm_before_fc", "fc_norm", "use_aux_norm", "norm_output",
                     "attention_bias", "mlp_bias", "bias")

PROVENANCE_KEYS = ("engine", "engine_version", "architecture", "layer_rule", "layer_ids", "captured_layer_inputs",
                   "target", "engine_options")
"""What a draft keeps of the capture spec of its features (``shards/spec.py``)."""


def provenance(reader: ShardReader, cfg) -> dict:
    """The ``eaglebox`` block of a draft trained on ``reader``'s shards."""
    h = reader.header
    return {**{k: h[k] for k in PROVENANCE_KEYS}, "shards_digest": manifest_digest(reader.manifest),
            "samples": len(reader), "ttt_length": cfg.train.ttt_length}


def draft_config(spec: DraftSpec, provenance: dict) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "target_hidden_size": spec.target_hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab_size,
        "draft_vocab_size": spec.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": provenance["layer_ids"], "use_aux_hidden_state": True},
        "eaglebox": provenance,
    }
    if spec.rope_scaling:
        cfg["rope_scaling"] = spec.rope_scaling
    return cfg


def export_draft(out_dir: Path, spec: DraftSpec, weights: dict[str, torch.Tensor], provenance: dict,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write atomically (temp directory + rename); returns the directory."""
    out_dir = Path(out_dir)
    if set(weights) != SERVING_KEYS:
        raise EagleboxError(f"draft weights differ from SGLang's keys: {sorted(set(weights) ^ SERVING_KEYS)}")
    tensors = {k: (v if v.dtype in (torch.int64, torch.bool) else v.to(dtype)).contiguous() for k, v in weights.items()}
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(draft_config(spec, provenance), indent=1) + "\n")
    for f in tmp.iterdir():  # safetensors writes 0600; a serving container runs as another user
        f.chmod(0o644)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    check_export(out_dir)
    return out_dir


def check_export(path: Path) -> dict:
    """Validate a draft directory for SGLang 0.5.23; returns its config."""
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EagleboxError(f"{path / 'config.json'}: cannot read ({err})") from err
    if cfg.get("architectures") != ["LlamaForCausalLMEagle3"]:
        raise EagleboxError(f"{path}: architectures must be ['LlamaForCausalLMEagle3'], got {cfg.get('architectures')}")
    bad = [k for k in IGNORED_BY_SGLANG if cfg.get(k) or (cfg.get("eagle_config") or {}).get(k)]
    if bad or cfg.get("num_hidden_layers") != 1:
        raise EagleboxError(f"{path}: config sets {bad or 'num_hidden_layers != 1'}, which SGLang 0.5.23's "
                            "LlamaForCausalLMEagle3 ignores or trains differently")
    if not isinstance(cfg.get("head_dim"), int):
        raise EagleboxError(f"{path}: config.json has no head_dim; SGLang would take hidden_size // "
                            "num_attention_heads, which need not be the width the draft was trained with")
    if cfg.get("tie_word_embeddings"):
        raise EagleboxError(f"{path}: tie_word_embeddings would make SGLang use the embedding as lm_head")
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys}
    except OSError as err:
        raise EagleboxError(f"{path / 'model.safetensors'}: cannot read ({err})") from err
    if keys != SERVING_KEYS:
        raise EagleboxError(f"{path}: weights {sorted(keys ^ SERVING_KEYS)} differ from what SGLang loads")
    H, V = cfg["hidden_size"], cfg["draft_vocab_size"]
    want = {"fc.weight": (H, cfg["target_hidden_size"] * len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])),
            "lm_head.weight": (V, H), "d2t": (V,), "t2d": (cfg["vocab_size"],),
            "midlayer.self_attn.q_proj.weight": (cfg["num_attention_heads"] * cfg["head_dim"], 2 * H)}
    for k, shape in want.items():
        if shapes[k] != shape:
            raise EagleboxError(f"{path}: {k} has shape {shapes[k]}, config implies {shape}")
    return cfg
