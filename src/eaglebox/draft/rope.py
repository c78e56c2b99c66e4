"""The draft's RoPE block, refused where the trainer and SGLang's draft class would read it differently.

The trainer builds its rotary table with transformers' ``ROPE_INIT_FUNCTIONS`` (``train/rope.py``);
SGLang 0.5.23's ``LlamaForCausalLMEagle3`` with ``get_rope`` (``layers/rotary_embedding/factory.py``,
``yarn.py``). They agree on default, llama3 and yarn blocks (logits within ~1e-5) except where one
reads a key the other ignores or reads otherwise; :func:`rope_mismatches` lists exactly those.
"""

from __future__ import annotations

import math

CHECKED_TYPES = ("default", "llama3", "yarn")


def _mscale(factor: float, m: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn_scales(rope: dict) -> tuple[float, float]:
    """The factor cos and sin are multiplied by: (transformers', SGLang's)."""
    f = float(rope["factor"])
    ms, mad = rope.get("mscale"), rope.get("mscale_all_dim")
    hf = rope.get("attention_factor")
    if hf is None:  # transformers: attention_factor, else the mscale ratio when both are truthy
        hf = _mscale(f, ms) / _mscale(f, mad) if ms and mad else _mscale(f)
    # SGLang: the mscale ratio when both are set (0 included), times attn_factor; attention_factor unread
    sgl = _mscale(f, ms) / _mscale(f, mad) if ms is not None and mad is not None else _mscale(f)
    return float(hf), sgl * float(rope.get("attn_factor", 1.0))


def rope_mismatches(rope: dict) -> list[str]:
    """What of ``rope`` (a non-default ``rope_scaling``/``rope_parameters`` block) the two read differently."""
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in CHECKED_TYPES or "mrope_section" in rope:
        return [f"rope_type {kind!r}{' with mrope_section' if 'mrope_section' in rope else ''}: eaglebox's "
                f"trainer is checked against SGLang's draft RoPE for {', '.join(CHECKED_TYPES)} only"]
    out = []
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        out.append("partial_rotary_factor: transformers reads it from this block, SGLang's draft from the "
                   "config's top level (absent: 1)")
    if kind == "llama3":
        out += [f"{k}: missing (transformers requires it, SGLang defaults it)"
                for k in ("factor", "low_freq_factor", "high_freq_factor") if rope.get(k) is None]
    if kind == "yarn":
        if rope.get("factor") is None:
            return out + ["factor: missing (transformers derives it from the position counts, SGLang takes 1.0)"]
        if rope.get("extrapolation_factor", 1.0) != 1.0:
            out.append("extrapolation_factor: SGLang reads it, transformers ignores it")
        out += [f"{k}: 0 (transformers reads 0 as the default {d}, SGLang divides by it)"
                for k, d in (("beta_fast", 32), ("beta_slow", 1)) if rope.get(k) == 0]
        hf, sgl = yarn_scales(rope)
        if not math.isclose(hf, sgl, rel_tol=1e-9):
            keys = [k for k in ("attention_factor", "attn_factor", "mscale", "mscale_all_dim") if k in rope]
            out.append(f"{'/'.join(keys)}: cos and sin scaled by {hf:.6g} in the trainer and by {sgl:.6g} in SGLang "
                       "(transformers: attention_factor if set, else the mscale/mscale_all_dim ratio when both "
                       "are non-zero; SGLang: never attention_factor, the ratio when both are set, times attn_factor)")
    return out
