"""The parity oracle: captured features against an independent HF transformers forward (fp32).

For each captured aux layer it reports the cosine and max relative error against every reference
residual stream, and which one matches best. A correct capture matches the layer input the capture
spec says SGLang hooks (``captured_layer_inputs``; HF's ``hidden_states[i]`` is the input of layer
``i``) and beats the neighbours; an off-by-one rule or another engine's kernels show up as numbers.
"""

from __future__ import annotations

import torch

from eaglebox.shards.format import ShardReader


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def parity_report(shards_dir, model_path, num_samples: int = 8, trust_remote_code: bool = False) -> dict:
    """``trust_remote_code``: ``model.trust_remote_code`` (a model whose modeling code ships with it)."""
    from transformers import AutoModelForCausalLM

    reader = ShardReader(shards_dir)
    spec = reader.header
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
    return {"engine": spec["engine"], "engine_version": spec["engine_version"], "samples": len(caps),
            "tokens": int(cap.shape[0]), "aux": layers,
            "last": {"cos": round(_cos(last, rl), 6), "max_rel_err": round(_max_rel(last, rl), 6)},
            "ok": all(x["best_reference_index"] == x["reference_index"] for x in layers)}
