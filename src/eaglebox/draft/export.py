"""Write the draft as the HF-style directory SGLang 0.5.23 loads: ``LlamaForCausalLMEagle3`` (``llama``)
or ``Eagle3DeepseekV2ForCausalLM`` (``deepseek_mla``, ``models/kimi_k25_eagle3.py``).

``config.json`` names only keys the chosen class reads, the EAGLE-3.1 ``fc_norm`` and ``norm_output``
included (both classes implement them); options the trainer does not implement (``norm_before_fc``,
``norm_before_residual``, ``use_aux_norm``, biases, several layers, scaled MLA RoPE) are never written,
and :func:`check_export` refuses a directory that has them, naming the key. An ``eaglebox`` block
records where the features came from (engine, version, the ids SGLang was given and the layers it
hooked, the target's fingerprint, the engine options, data manifest digest; serving compares it with
the target before it starts) and the draft's KV cache bytes a token.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglebox.draft.spec import MLA_DIMS, DraftSpec
from eaglebox.errors import EagleboxError
from eaglebox.shards.format import ShardReader

CLASSES = {"llama": "LlamaForCausalLMEagle3", "deepseek_mla": "Eagle3DeepseekV2ForCausalLM"}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}

COMMON_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
}
ATTENTION_KEYS = {
    "llama": {f"midlayer.self_attn.{k}_proj.weight" for k in "qkvo"},
    "deepseek_mla": {f"midlayer.self_attn.{k}.weight" for k in (
        "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")},
}
SERVING_KEYS = COMMON_KEYS | ATTENTION_KEYS["llama"]
"""Exactly what SGLang's Llama loader maps onto the model (``midlayer`` -> ``layers.0``); nothing else."""


def serving_keys(architecture: str, fc_norm: int = 0) -> set[str]:
    """What the class's loader maps onto the model, for ``fc_norm`` norms (0: none); nothing else. The
    MLA loader keeps ``midlayer.*`` and fuses ``q_a_proj`` with ``kv_a_proj_with_mqa``."""
    return COMMON_KEYS | ATTENTION_KEYS[architecture] | {f"fc_norm.{i}.weight" for i in range(fc_norm)}


UNIMPLEMENTED = ("norm_before_residual", "norm_before_fc", "use_aux_norm", "attention_bias", "mlp_bias", "bias")
"""Keys SGLang reads (or ignores) that eaglebox's trainer does not implement."""


def provenance(reader: ShardReader, ttt_length: int) -> dict:
    """The ``eaglebox`` block of a draft trained on ``reader``'s shards: their capture spec's
    provenance (:meth:`eaglebox.shards.contract.CaptureSpec.provenance`) and the data it saw."""
    return {**reader.capture.provenance(), "shards_digest": reader.digest(),
            "samples": len(reader), "ttt_length": ttt_length}


def kv_cache_report(spec: DraftSpec, dtype: torch.dtype = torch.bfloat16) -> dict:
    n = torch.finfo(dtype).bits // 8
    formula = ("(kv_lora_rank + qk_rope_head_dim) * bytes" if spec.architecture == "deepseek_mla"
               else "2 * num_key_value_heads * head_dim * bytes")
    return {"bytes_per_token": spec.kv_cache_bytes_per_token(n), "dtype": str(dtype).removeprefix("torch."),
            "formula": formula}


def draft_config(spec: DraftSpec, provenance: dict) -> dict:
    cfg = {
        "architectures": [CLASSES[spec.architecture]],
        "model_type": "llama" if spec.architecture == "llama" else "deepseek_v3",
        "hidden_size": spec.hidden_size,
        "target_hidden_size": spec.target_hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.num_attention_heads,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab_size,
        "draft_vocab_size": spec.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "fc_norm": spec.fc_norm,
        "norm_output": spec.norm_output,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": provenance["layer_ids"], "use_aux_hidden_state": True},
        "eaglebox": {**provenance, "draft_kv_cache": kv_cache_report(spec)},
    }
    if spec.architecture == "llama":
        cfg.update(num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim)
    else:  # SGLang's MLA draft: the five widths, interleaved (DeepSeek) RoPE, default frequencies only
        cfg.update({k: getattr(spec, k) for k in MLA_DIMS}, rope_interleave=True, rope_scaling=None)
    if spec.rope_scaling:
        cfg["rope_scaling"] = spec.rope_scaling
    return cfg


def exported_spec(path: Path) -> DraftSpec:
    """The :class:`DraftSpec` an exported draft was written from (:func:`draft_config`'s inverse)."""
    c = json.loads((Path(path) / "config.json").read_text())
    arch = ARCHITECTURES[c["architectures"][0]]
    mla = {k: c[k] for k in MLA_DIMS} if arch == "deepseek_mla" else {}
    heads = c["num_attention_heads"]
    return DraftSpec(
        hidden_size=c["hidden_size"], target_hidden_size=c["target_hidden_size"],
        num_aux=len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]), num_attention_heads=heads,
        num_key_value_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"],
        intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"], draft_vocab_size=c["draft_vocab_size"],
        rms_norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"], rope_scaling=c.get("rope_scaling"),
        max_position_embeddings=c["max_position_embeddings"], architecture=arch, fc_norm=c["fc_norm"],
        norm_output=c["norm_output"], **mla)


def export_draft(out_dir: Path, spec: DraftSpec, weights: dict[str, torch.Tensor], provenance: dict,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write to a temporary directory, check it, then swap it in (:func:`replace_dir`; after a crash
    :func:`recover_export` puts an ``.old`` draft back). Returns the directory."""
    out_dir = Path(out_dir)
    want = serving_keys(spec.architecture, spec.num_aux if spec.fc_norm else 0)
    if set(weights) != want:
        raise EagleboxError(f"draft weights differ from SGLang's keys: {sorted(set(weights) ^ want)}")
    tensors = {k: (v if v.dtype in (torch.int64, torch.bool) else v.to(dtype)).contiguous() for k, v in weights.items()}
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(draft_config(spec, provenance), indent=1) + "\n")
    for f in tmp.iterdir():  # safetensors writes 0600; a serving container runs as another user
        f.chmod(0o644)
    check_export(tmp)
    replace_dir(tmp, out_dir)
    kv = kv_cache_report(spec, dtype)
    print(f"export: {CLASSES[spec.architecture]} draft -> {out_dir}; draft KV cache {kv['bytes_per_token']} bytes a "
          f"token in {kv['dtype']} ({kv['formula']})", flush=True)
    return out_dir


def replace_dir(new: Path, out_dir: Path) -> None:
    """Put the complete directory ``new`` at ``out_dir``: the old one renamed aside, the new one renamed
    in, the old one deleted. At every moment ``out_dir`` or its ``.old`` sibling holds a complete draft."""
    out_dir = Path(out_dir)
    recover_export(out_dir)
    old = out_dir.with_name(f".{out_dir.name}.old")
    if out_dir.exists():
        os.rename(out_dir, old)
    os.rename(new, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def recover_export(out_dir: Path) -> None:
    """After a crash between the two renames of :func:`replace_dir`: put the old draft back."""
    out_dir = Path(out_dir)
    old = out_dir.with_name(f".{out_dir.name}.old")
    if old.exists() and not out_dir.exists():
        os.rename(old, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def check_export(path: Path) -> dict:
    """Validate a draft directory for SGLang 0.5.23 (either class); returns its config."""
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EagleboxError(f"{path / 'config.json'}: cannot read ({err})") from err
    arch = ARCHITECTURES.get((cfg.get("architectures") or [None])[0])
    if arch is None or len(cfg["architectures"]) != 1:
        raise EagleboxError(f"{path}: architectures must be one of {[[c] for c in CLASSES.values()]}, got "
                            f"{cfg.get('architectures')}")
    cls = CLASSES[arch]
    bad = [k for k in UNIMPLEMENTED if cfg.get(k) or (cfg.get("eagle_config") or {}).get(k)]
    if bad or cfg.get("num_hidden_layers") != 1:
        raise EagleboxError(f"{path}: config sets {bad or 'num_hidden_layers != 1'}, which SGLang 0.5.23's "
                            f"{cls} ignores or eaglebox's trainer does not implement")
    if cfg.get("tie_word_embeddings"):
        raise EagleboxError(f"{path}: tie_word_embeddings would make SGLang use the embedding as lm_head")
    H, V, heads = cfg["hidden_size"], cfg["draft_vocab_size"], cfg["num_attention_heads"]
    if arch == "llama":
        if not isinstance(cfg.get("head_dim"), int):
            raise EagleboxError(f"{path}: config.json has no head_dim; SGLang would take hidden_size // "
                                "num_attention_heads, which need not be the width the draft was trained with")
        attn = {"midlayer.self_attn.q_proj.weight": (heads * cfg["head_dim"], 2 * H)}
    else:
        missing = [k for k in MLA_DIMS if not isinstance(cfg.get(k), int)]
        if missing:
            raise EagleboxError(f"{path}: config.json has no integer {', '.join(missing)}, which {cls} requires")
        if cfg.get("rope_interleave") is not True or cfg.get("rope_scaling") or cfg.get("rope_parameters"):
            raise EagleboxError(f"{path}: {cls} must get rope_interleave true and no rope_scaling/rope_parameters "
                                "(eaglebox trains interleaved default-frequency RoPE for MLA)")
        nope, rope, L = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
        attn = {"midlayer.self_attn.q_a_proj.weight": (cfg["q_lora_rank"], 2 * H),
                "midlayer.self_attn.q_b_proj.weight": (heads * (nope + rope), cfg["q_lora_rank"]),
                "midlayer.self_attn.kv_a_proj_with_mqa.weight": (L + rope, 2 * H),
                "midlayer.self_attn.kv_b_proj.weight": (heads * (nope + cfg["v_head_dim"]), L),
                "midlayer.self_attn.o_proj.weight": (H, heads * cfg["v_head_dim"])}
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys}
    except OSError as err:
        raise EagleboxError(f"{path / 'model.safetensors'}: cannot read ({err})") from err
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    want_keys = serving_keys(arch, aux if cfg.get("fc_norm") else 0)
    if keys != want_keys:
        raise EagleboxError(f"{path}: weights {sorted(keys ^ want_keys)} differ from what SGLang's {cls} loads")
    want = {"fc.weight": (H, cfg["target_hidden_size"] * aux), "lm_head.weight": (V, H), "d2t": (V,),
            "t2d": (cfg["vocab_size"],), **attn}
    for k, shape in want.items():
        if shapes[k] != shape:
            raise EagleboxError(f"{path}: {k} has shape {shapes[k]}, config implies {shape}")
    return cfg
