"""A tiny Kimi-K2.5-shaped chat target: DeepSeek-V3 architecture, made from nothing on a CPU.

What it shares with Kimi-K2.5's text model (``text_config`` of ``moonshotai/Kimi-K2.5``), scaled down:

- ``DeepseekV3ForCausalLM``: MLA attention (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``), a dense first layer (``first_k_dense_replace: 1``) and MoE
  layers after it (``moe_layer_freq: 1``) with routed and shared experts, routed as Kimi's are
  (``topk_method: noaux_tc``, sigmoid scores, one group, normalised top-k, a routed scaling factor);
- Kimi's yarn block as it is (factor 64 over 4096 positions, ``beta_fast = beta_slow = 1``,
  ``mscale = mscale_all_dim = 1``, ``rope_theta`` 50000): keys that transformers, SGLang's
  ``deepseek_v2.py`` and SGLang's Llama draft class read alike (``eaglebox.draft.rope``);
- a tokenizer that is code shipped in the model directory (``tokenization_tiny_kimi.py``, named by
  ``auto_map``): loading it needs ``trust_remote_code``, as Kimi's tiktoken tokenizer does.

The tokenizer's vocabulary, the chat data (recipe 3's chat + code corpus) and the training loop are
the tiny Llama target's (:mod:`eaglebox_dev.tiny`); so are the cache rule (a directory stamped with
this recipe is reused) and the shipping: the trained target is in the package (:data:`SHIPPED`, 4.5 MB,
stamped with the recipe and every file's sha256) because training it takes 10-25 minutes on a 2-core
machine; ``python -m eaglebox_dev.tiny_mla --retrain`` remakes it.
``moe_layer_freq`` must stay 1: transformers' DeepseekV3 makes every layer past
``first_k_dense_replace`` an MoE layer and does not read it, SGLang does.

The latent widths are not free: SGLang 0.5.23's Triton MLA decode kernel reads the values as the
transposed key block, so it needs ``next_pow2(kv_lora_rank + qk_rope_head_dim) ==
next_pow2(kv_lora_rank)`` unless the pair is (512, 64) -- Kimi's and DeepSeek's -- or (256, 32),
which it splits into a latent and a RoPE block. (64, 16) captured correctly (prefill) and then
failed at the first decode step; (256, 32) takes the same split-block path as Kimi's (512, 64).
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path

from eaglebox_dev import tiny

RECIPE = {
    "version": 1,
    "architecture": "DeepseekV3ForCausalLM",
    "vocab_size": tiny.RECIPE["vocab_size"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 256,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "seq_len": 256,
    "batch_size": 16,
    "steps": 400,
    "lr": 3e-3,
    "seed": 0,
}

SHIPPED = Path(__file__).parent / "assets" / "tiny-mla-target"
TOKENIZER_MODULE = Path(__file__).with_name("tokenization_tiny_kimi.py")
TOKENIZER_CLASS = "TinyKimiTokenizer"


def target_config(tok) -> dict:
    """``config.json`` as Kimi-K2.5's ``text_config`` spells it (``rope_scaling``, the MoE keys SGLang reads)."""
    r = RECIPE
    # a deep copy: transformers' config class adds keys to the rope_scaling dict it is given, which
    # would change RECIPE itself (and every stamp would then record another recipe than the code's)
    shape = copy.deepcopy({k: r[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq",
        "n_group", "topk_group", "topk_method", "scoring_func", "norm_topk_prob", "routed_scaling_factor",
        "rope_theta", "rope_scaling")})
    f = r["rope_scaling"]
    return {
        "architectures": [r["architecture"]], "model_type": "deepseek_v3", **shape,
        "vocab_size": len(tok), "num_key_value_heads": r["num_attention_heads"],
        "max_position_embeddings": int(f["original_max_position_embeddings"] * f["factor"]),
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
        "num_nextn_predict_layers": 0, "ep_size": 1, "aux_loss_alpha": 0.001, "seq_aux": True,
        "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, "torch_dtype": "bfloat16",
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
    }


def remote_code_tokenizer(fast, directory: Path):
    """Write the tiny BPE as ``tiny_bpe.json`` with the shipped tokenizer class into ``directory``
    (``tokenizer_config.json`` with ``auto_map``, no ``tokenizer.json``); returns the class's instance."""
    import importlib.util

    directory = Path(directory)
    fast.backend_tokenizer.save(str(directory / "tiny_bpe.json"))
    shutil.copyfile(TOKENIZER_MODULE, directory / TOKENIZER_MODULE.name)
    spec = importlib.util.spec_from_file_location("tokenization_tiny_kimi", directory / TOKENIZER_MODULE.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    specials = [t for t in tiny.SPECIAL if t not in (fast.bos_token, fast.eos_token, fast.pad_token)]
    tok = getattr(mod, TOKENIZER_CLASS)(str(directory / "tiny_bpe.json"), bos_token=fast.bos_token,
                                        eos_token=fast.eos_token, pad_token=fast.pad_token,
                                        extra_special_tokens=specials)
    tok.chat_template = fast.chat_template
    tok.save_pretrained(directory)
    cfg_path = directory / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = TOKENIZER_CLASS
    cfg["auto_map"] = {"AutoTokenizer": [f"{TOKENIZER_MODULE.stem}.{TOKENIZER_CLASS}", None]}
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (directory / "tokenizer.json").unlink(missing_ok=True)
    return tok


def check_same_ids(fast, tok, convs) -> None:
    """The shipped class must give the tiny BPE's ids (the target is trained on those)."""
    for c in convs:
        a = fast.apply_chat_template(c, tokenize=True, return_dict=False)
        b = tok.apply_chat_template(c, tokenize=True, return_dict=False)
        if a != b:
            raise RuntimeError(f"{TOKENIZER_CLASS} and the tiny BPE tokenize a conversation differently: {c!r}")
        if tok.decode(b, skip_special_tokens=True) != fast.decode(a, skip_special_tokens=True):
            raise RuntimeError(f"{TOKENIZER_CLASS} and the tiny BPE decode differently: {c!r}")


def make_tiny_mla_target(out: Path, *, retrain: bool = False, log=print) -> Path:
    """Create (or reuse) the tiny DeepSeek-V3 target in ``out``; returns ``out``. The shipped target is
    copied when it matches :data:`RECIPE`; otherwise, or with ``retrain``, it is trained."""
    out = Path(out)
    if not retrain:
        if tiny.is_current(out, RECIPE, log):
            return out
        why = tiny.shipped_ok(SHIPPED, RECIPE)
        if why is None:
            return tiny.copy_shipped(out, SHIPPED, log=log)
        log(f"tiny target: not using the shipped DeepSeek-V3 target ({why}); training it (10+ minutes)")
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    t0 = time.monotonic()
    torch.manual_seed(RECIPE["seed"])
    torch.set_num_threads(2)
    convs = tiny.conversations()["train"]
    fast = tiny.train_tokenizer(convs, RECIPE["vocab_size"])
    data = tiny.token_stream(fast, convs)
    config = target_config(fast)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**config))
    loss = tiny.train_lm(model, data, RECIPE, log=log)

    def write(d: Path) -> None:
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")  # Kimi's spelling, not transformers v5's
        tok = remote_code_tokenizer(fast, d)
        check_same_ids(fast, tok, convs[:200])

    return tiny.publish(out, RECIPE, write, t0=t0, final_loss=loss, log=log)


def main(argv: list[str] | None = None) -> int:
    """``python -m eaglebox_dev.tiny_mla --retrain``: remake the shipped target from :data:`RECIPE`."""
    return tiny.retrain_cli(argv, "eaglebox_dev.tiny_mla", lambda d: make_tiny_mla_target(d, retrain=True),
                            SHIPPED, RECIPE)


if __name__ == "__main__":
    raise SystemExit(main())
