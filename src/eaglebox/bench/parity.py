"""The parity oracle: captured features against an independent HF transformers forward (fp32).

For each captured aux layer it reports the cosine and max relative error against every reference
residual stream, and which one matches best. A correct capture matches the layer input the capture
spec says SGLang hooks (``captured_layer_inputs``; HF's ``hidden_states[i]`` is the input of layer
``i``) and beats the neighbours; an off-by-one rule or another engine's kernels show up as numbers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglebox.errors import EagleboxError
from eaglebox.shards.format import MANIFEST, ShardReader
from eaglebox.target.config import text_config


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def check_reference(spec: dict, model_path, shards_dir) -> int:
    """Refuse a reference model that cannot reproduce what the shards claim: a captured layer input it
    does not have, another hidden size or layer count; returns its vocabulary size."""
    config = Path(model_path) / "config.json"
    text = text_config(model_path)
    n, H, vocab = int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"])
    where = f"{Path(shards_dir) / MANIFEST} (capture spec)"
    fix = ("point model.path at the target the shards were captured from, or extract the shards again from "
           "this one (`eaglebox extract`)")
    bad = [i for i in spec["captured_layer_inputs"] if not 0 <= i < n]
    if bad:
        raise EagleboxError(f"{where}: captured_layer_inputs {spec['captured_layer_inputs']} (layer_ids "
                            f"{spec['layer_ids']}) name the inputs of layers {bad}, which the reference "
                            f"{config} ({n} layers: inputs 0..{n - 1}) does not have; {fix}")
    if spec["hidden_size"] != H:
        raise EagleboxError(f"{where}: hidden_size {spec['hidden_size']}, the reference {config} has {H}; {fix}")
    if spec.get("num_layers", n) != n:
        raise EagleboxError(f"{where}: captured from a {spec['num_layers']}-layer target, the reference {config} "
                            f"has {n} layers; {fix}")
    return vocab


def parity_report(shards_dir, model_path, num_samples: int = 8, trust_remote_code: bool = False) -> dict:
    """``trust_remote_code``: ``model.trust_remote_code`` (a model whose modeling code ships with it).

    Every sample is verified against the manifest first (the report's ``verified``): a feature file
    changed on disk is refused, not reported as a parity failure, also when it is not one compared."""
    from transformers import AutoModelForCausalLM

    reader = ShardReader(shards_dir, verify=True)
    spec = reader.header
    vocab = check_reference(spec, model_path, shards_dir)
    for i in range(min(num_samples, len(reader))):
        path = reader.index[i][0]
        ids, _ = reader.ids_and_mask(i)
        if int(ids.max()) >= vocab:
            raise EagleboxError(f"{path}: token id {int(ids.max())} is beyond the reference's vocabulary "
                                f"({vocab}, {Path(model_path) / 'config.json'}); point model.path at the target "
                                "the shards were captured from")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 trust_remote_code=trust_remote_code).eval()
    H = spec["hidden_size"]
    refs, caps, lasts, ref_last = [], [], [], []
    with torch.no_grad():
        for i in range(min(num_samples, len(reader))):
            s = reader.get(i)
            out = model(s["input_ids"][None], output_hidden_states=True)
            refs.append(torch.stack(out.hidden_states[:-1])[:, 0])  # [n_layers, L, H]: inputs of layers
            ref_last.append(out.hidden_states[-1][0])  # post final norm: the lm_head input
            caps.append(s["aux"].float())
            lasts.append(s["last"].float())
    ref, cap = torch.cat(refs, 1), torch.cat(caps)
    layers = []
    for c, (sid, expected) in enumerate(zip(spec["layer_ids"], spec["captured_layer_inputs"])):
        got = cap[:, c * H : (c + 1) * H]
        scores = [_cos(got, ref[k]) for k in range(ref.shape[0])]
        layers.append({
            "layer_id": sid, "reference_index": expected,
            "cos": round(scores[expected], 6), "max_rel_err": round(_max_rel(got, ref[expected]), 6),
            "best_reference_index": int(max(range(len(scores)), key=scores.__getitem__)),
            "cos_by_reference_index": [round(x, 6) for x in scores],
        })
    last, rl = torch.cat(lasts), torch.cat(ref_last)
    return {"engine": spec["engine"], "engine_version": spec["engine_version"], "verified": len(reader),
            "samples": len(caps),
            "tokens": int(cap.shape[0]), "aux": layers,
            "last": {"cos": round(_cos(last, rl), 6), "max_rel_err": round(_max_rel(last, rl), 6)},
            "ok": all(x["best_reference_index"] == x["reference_index"] for x in layers)}
