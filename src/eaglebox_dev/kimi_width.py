"""A DeepSeek-V3 target at Kimi-K2.5's widths for the GPU check of the Kimi path (issue 41), made where
it runs: no model hub reaches the lent GPU, and Kimi-K2.5 itself needs eight.

What it shares with Kimi-K2.5's ``text_config``: hidden 7168, 64 MLA heads (q_lora 1536, kv_lora 512,
qk_nope 128, qk_rope 64, v 128), Kimi's yarn block (:data:`eaglebox_dev.tiny_mla.RECIPE`'s, as Kimi
ships it), a dense first layer of intermediate 18432, then MoE layers of Kimi's expert shape
(moe_intermediate 2048, one shared expert, ``noaux_tc`` sigmoid routing, top 8) but 16 routed experts
instead of 384 and ``layers`` layers instead of 61, so that three servers of it fit one 80 GB GPU
with their KV pools (the bench keeps the target alone and two speculative servers up together).

A few layers are trained (:func:`make_shallow`, a language model on the code corpus the served check
uses), then :func:`pad_target` places them among pass-through layers whose attention ``o_proj`` and
whose experts' and shared expert's ``down_proj`` (the dense layer's ``down_proj``) are zero: they add
exactly 0 to the residual, so the padded model computes the shallow one's logits while every decode
step reads every layer's weights and runs every layer's kernels.

The widths are parameters: :data:`SMOKE` is the same model at a width the CPU runs (the flow, not the
figures). Its latent pair (256, 32) is one of the two SGLang 0.5.23's Triton MLA decode kernel splits
(:mod:`eaglebox_dev.tiny_mla`).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch

from eaglebox_dev.checkpoint_files import read_state, write_shards
from eaglebox_dev.tiny_mla import RECIPE as TINY_MLA

KIMI = {"hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 16, "num_experts_per_tok": 8}
"""Kimi-K2.5's text_config widths; 16 routed experts (Kimi: 384), each token still routed to 8."""
SMOKE = {"hidden_size": 128, "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 256,
         "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "intermediate_size": 256,
         "moe_intermediate_size": 64, "n_routed_experts": 8, "num_experts_per_tok": 2}
"""The same model on the CPU (tiny_mla's widths)."""
ROUTING = {"n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
           "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
           "routed_scaling_factor": 2.827}
"""Kimi's routing (one group, sigmoid scores with a correction bias, normalised top-k, Kimi-K2's scale)."""


def placement(layers: int) -> tuple[int, int, int, int]:
    """Where the 4 trained layers go in a ``layers``-layer target: the dense layer at 0 and MoE layers at
    1, layers // 2 - 1 and layers - 4, so that the EAGLE-3 default capture (inputs of 2, layers // 2,
    layers - 3) reads each trained layer's output at the first layer input that holds it. A later input
    holds the same stream (pass-through layers add nothing), and ``eaglebox parity`` reports the
    earliest of equal references as the best one."""
    at = (0, 1, layers // 2 - 1, layers - 4)
    if layers < 8:
        raise ValueError(f"{layers} layers: the 4 trained layers need at least 8 (placement {at})")
    return at


def target_config(vocab_size: int, special: dict[str, int], layers: int, widths: dict) -> dict:
    """``config.json`` as Kimi-K2.5's ``text_config`` spells it (``DeepseekV3ForCausalLM``'s keys and
    ``rope_scaling``, the MoE keys SGLang reads); ``special``: bos/eos/pad token ids."""
    rope = copy.deepcopy(TINY_MLA["rope_scaling"])  # transformers' config class adds keys to the dict it is given
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **widths, **ROUTING,
        "vocab_size": vocab_size, "num_hidden_layers": layers, "num_key_value_heads": widths["num_attention_heads"],
        "rope_theta": TINY_MLA["rope_theta"], "rope_scaling": rope,
        "max_position_embeddings": int(rope["original_max_position_embeddings"] * rope["factor"]),
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
        "num_nextn_predict_layers": 0, "ep_size": 1, "aux_loss_alpha": 0.001, "seq_aux": True,
        "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, "torch_dtype": "bfloat16",
        **{f"{k}_token_id": v for k, v in special.items()},
    }


def build(config: dict, seed: int = 0, device: str = "cpu"):
    """transformers' DeepseekV3 of ``config`` (its own init), fp32 on ``device``."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return DeepseekV3ForCausalLM(DeepseekV3Config(**copy.deepcopy(config)))


def save(model, config: dict, path: Path, files: list[Path]) -> Path:
    """``model`` in bf16 at ``path`` with ``config`` as its config.json (Kimi's spelling, not the one
    transformers writes) and ``files`` (tokenizer) beside it; written into a sibling and renamed, so a
    cut run leaves no target that looks made."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for f in files:
        shutil.copy(f, tmp / f.name)
    shutil.rmtree(path, ignore_errors=True)
    tmp.replace(path)
    return path


def make_shallow(path: Path, tokenizer_dir: Path, convs: list, recipe: dict, widths: dict, *, device: str,
                 log=print) -> dict:
    """The 4 trained layers (dense, then 3 MoE) as a model of their own: a language model on ``convs``
    (windows that start at a conversation, bf16 autocast on a GPU: :func:`eaglebox_dev.tiny.train_lm`);
    returns its training record. ``recipe``: steps, seq_len, batch_size, lr, seed."""
    from transformers import AutoTokenizer

    from eaglebox_dev.tiny import answer_stream, train_lm

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids, _, starts = answer_stream(tok, convs)
    special = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    config = target_config(len(tok), special, 4, widths)
    model = build(config, recipe["seed"], device)
    # transformers' grouped experts are not autocast ops: they run in the fp32 master weights' dtype, so the
    # experts' matmuls (most of a step's work) take TF32 instead of plain fp32 on the GPU
    if device != "cpu":
        torch.set_float32_matmul_precision("high")
    loss = train_lm(model, ids, recipe, starts=starts, device=device, log=log)
    save(model, config, path, sorted(p for p in Path(tokenizer_dir).iterdir() if p.is_file()))
    return {**recipe, "conversations": len(convs), "tokens": len(ids), "final_loss": round(loss, 4)}


def pass_through(name: str, like: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """A pass-through layer's tensor ``name`` (the key after ``model.layers.N.``): zero where the layer
    writes to the residual (attention ``o_proj``, every ``down_proj``), norms 1, the routing bias 0,
    random elsewhere (so the layer still runs real kernels on real-looking values)."""
    if name == "self_attn.o_proj.weight" or name.endswith("down_proj.weight") or name.endswith("e_score_correction_bias"):
        return torch.zeros_like(like)
    if name.endswith("layernorm.weight"):
        return torch.ones_like(like)
    return (torch.randn(like.shape, generator=gen, device=gen.device) * std).to(like.dtype).cpu()


def pad_target(shallow: Path, out: Path, layers: int, seed: int = 0, device: str = "cpu",
               shard_bytes: int = 4 << 30) -> Path:
    """``shallow``'s 4 layers at :func:`placement` of a ``layers``-layer copy; every other layer is
    pass-through (:func:`pass_through`), shaped like the trained dense layer before
    ``first_k_dense_replace`` and like a trained MoE layer after it."""
    src = read_state(shallow)
    cfg = json.loads((shallow / "config.json").read_text())
    at = placement(layers)
    if cfg["num_hidden_layers"] != len(at):
        raise ValueError(f"{shallow}: {cfg['num_hidden_layers']} trained layers, {len(at)} places")
    std = cfg["initializer_range"]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator(device=device).manual_seed(seed)

    def layer(i: int) -> dict[str, torch.Tensor]:
        p = f"model.layers.{i}."
        return {k[len(p):]: v for k, v in src.items() if k.startswith(p)}

    def tensors():
        yield from ((k, v) for k, v in src.items() if not k.startswith("model.layers."))
        for i in range(layers):
            if i in at:
                yield from ((f"model.layers.{i}.{name}", t) for name, t in layer(at.index(i)).items())
                continue
            template = layer(0 if i < cfg["first_k_dense_replace"] else 1)
            for name, like in template.items():
                yield f"model.layers.{i}.{name}", pass_through(name, like, std, gen)

    write_shards(tmp, tensors(), shard_bytes)
    cfg["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    for f in shallow.iterdir():
        if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, tmp / f.name)
    (tmp / "eaglebox-padded.json").write_text(json.dumps({
        "trained_layers_at": list(at), "layers": layers,
        "pass_through": f"o_proj and every down_proj zero, routing bias 0, norms 1, the rest random (std {std})"},
        indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def logits_diff(shallow: Path, target: Path, dtype=torch.bfloat16, device: str = "cpu") -> float:
    """Max abs difference of the padded target's logits and the shallow one's (HF forward): 0.0 when
    the pass-through layers add nothing."""
    from transformers import AutoModelForCausalLM

    ids = torch.arange(3, 19, 2, device=device)[None]  # below any vocabulary the corpus tokenizer gives
    outs = []
    for p in (shallow, target):
        m = AutoModelForCausalLM.from_pretrained(p, dtype=dtype).to(device).eval()
        with torch.no_grad():
            outs.append(m(ids).logits.float())
        del m
    return float((outs[0] - outs[1]).abs().max())
