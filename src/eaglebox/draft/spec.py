"""The draft's shape, and how it follows from the target and ``train.draft``.

Two architectures, each one SGLang 0.5.23 class: ``llama`` (``LlamaForCausalLMEagle3``, GQA heads of
``head_dim``) and ``deepseek_mla`` (``Eagle3DeepseekV2ForCausalLM``, multi-latent attention; its
``head_dim`` is ``qk_nope_head_dim + qk_rope_head_dim`` and it has as many KV heads as heads once
``kv_b_proj`` expands the latent, which is how the trainer computes it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from eaglebox.draft.rope import rope_mismatches
from eaglebox.errors import EagleboxError
from eaglebox.target.config import is_mla, read_target_config


@dataclass(frozen=True)
class DraftSpec:
    hidden_size: int
    target_hidden_size: int
    num_aux: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    architecture: str = "llama"
    fc_norm: bool = False
    norm_output: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """What SGLang's KV pool holds for the draft a token: MLA keeps the latent and the RoPE key
        (``kv_lora_rank + qk_rope_head_dim``), Llama a key and a value of every KV head."""
        if self.architecture == "deepseek_mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.num_key_value_heads * self.head_dim * dtype_bytes


MLA_DIMS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def draft_spec(model_path: Path, draft_cfg, num_aux: int) -> DraftSpec:
    """The target's shape and RoPE, with the heads, widths and RoPE ``draft_cfg`` (``train.draft``) overrides.

    ``head_dim`` is always explicit in the draft config (SGLang's draft class takes ``head_dim``, else
    ``hidden_size // num_attention_heads``): the target's when the draft keeps its heads, except for an
    MLA target, whose ``head_dim`` (when present: transformers v5 writes ``qk_rope_head_dim`` there) is
    no attention head width. A ``deepseek_mla`` draft takes its MLA widths from ``draft_cfg``, else
    from an MLA target.
    """
    hf = read_target_config(model_path)
    t, prefix = (hf["text_config"], "text_config.") if "text_config" in hf else (hf, "")
    H = int(t["hidden_size"])
    target_heads = int(t["num_attention_heads"])
    heads = draft_cfg.num_attention_heads or target_heads
    kv = draft_cfg.num_key_value_heads or int(t.get("num_key_value_heads", heads))
    if draft_cfg.num_attention_heads or is_mla(model_path):
        head_dim = H // heads
    else:
        head_dim = int(t.get("head_dim") or H // target_heads)
    mla = {}
    if draft_cfg.architecture == "deepseek_mla":
        mla = _mla_dims(draft_cfg, t, Path(model_path) / "config.json", prefix)
        if draft_cfg.num_key_value_heads:
            raise EagleboxError("train.draft.num_key_value_heads: the deepseek_mla draft has no KV heads to set "
                                "(its keys and values come from one latent a token); leave it unset")
        kv, head_dim = heads, mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    if heads % kv:
        raise EagleboxError(f"train.draft: {heads} attention heads are not a multiple of {kv} KV heads")
    key = "rope_parameters" if t.get("rope_parameters") else "rope_scaling"
    target_rope = t.get(key) or {}
    if draft_cfg.rope_scaling is not None:
        rope, where = dict(draft_cfg.rope_scaling), "train.draft.rope_scaling"
    else:
        rope, where = dict(target_rope) or None, f"{Path(model_path) / 'config.json'}: {prefix}{key}"
    theta = float((rope or {}).get("rope_theta") or target_rope.get("rope_theta") or t.get("rope_theta") or 10000.0)
    if rope and rope.get("rope_type", rope.get("type")) == "default":
        rope = None
    if rope and mla:
        raise EagleboxError(f"{where}: the deepseek_mla draft is trained with default RoPE only (SGLang's "
                            "Eagle3DeepseekV2ForCausalLM turns any other block into DeepSeek YaRN, with its own "
                            "attention scale, which eaglebox's trainer does not implement). Set "
                            'train.draft.rope_scaling to {"rope_type": "default"} (the draft\'s RoPE need not be '
                            "the target's)")
    bad = rope_mismatches(rope) if rope else []
    if bad:
        raise EagleboxError(f"{where}: the trainer (transformers) and SGLang 0.5.23's LlamaForCausalLMEagle3 would "
                            "apply different RoPE to the draft: " + "; ".join(bad) + ". Set train.draft.rope_scaling "
                            "to a block both read alike (the draft's RoPE need not be the target's), e.g. "
                            '{"rope_type": "default"}')
    return DraftSpec(
        hidden_size=H, target_hidden_size=H, num_aux=num_aux, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim,
        intermediate_size=draft_cfg.intermediate_size or int(t["intermediate_size"]),
        vocab_size=int(t["vocab_size"]), draft_vocab_size=draft_cfg.draft_vocab_size,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=rope,
        max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
        architecture=draft_cfg.architecture, fc_norm=draft_cfg.fc_norm, norm_output=draft_cfg.norm_output, **mla,
    )


def _mla_dims(draft_cfg, t: dict, where: Path, prefix: str) -> dict:
    """The five MLA widths: ``train.draft``'s, else the target's; refused, naming the key, when neither has one."""
    out = {}
    for k in MLA_DIMS:
        v = getattr(draft_cfg, k) or t.get(k)
        if not v:
            raise EagleboxError(f"train.draft.{k}: the deepseek_mla draft needs it (SGLang's Eagle3DeepseekV2ForCausalLM "
                                f"requires {k}) and {where} has no {prefix}{k} to take; set it")
        out[k] = int(v)
    if out["qk_rope_head_dim"] % 2:
        raise EagleboxError(f"train.draft.qk_rope_head_dim: {out['qk_rope_head_dim']} is odd; RoPE rotates pairs")
    return out
