"""GPU, issues 41 and 39: the trainer's CUDA kernels against its eager references at the served drafts' shapes.

The Kimi check's first GPU run (``benchmarks/results/kimi-h100-2026-12-07-s26/``) trained both draft forms
to 0.36 accuracy at the second draft position while SGLang's draft class accepted 0.01 there; the served
check's Llama-8B-width draft (head dim 128) accepted 0.5-0.6. The Kimi drafts' attention head dims are 112
(Llama form) and 192/128 (MLA form), not powers of two. Per shape, on a random draft:

1. ``eaglebox.train.kernel_check`` (what every CUDA ``eaglebox train`` now runs before its first step):
   the trainer's compiled blocks and flex attention against its eager references;
2. the trainer's logits of each TTT step (its CUDA path, bf16 autocast, as it trains) against SGLang's
   draft class on the GPU (what the trainer's held-out evaluation runs, through ``tools/h200``'s kernel
   stand-ins as SGLang serves): the relative error per draft position. A mismatch at positions 2+ only,
   with (1) clean, puts the fault on SGLang's side of the GPU path.

About a minute; prints each measurement and writes ``kernels.json`` as it goes.

    bash tools/h200/run.sh kernels
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from eaglebox.config.schema import DraftConfig  # noqa: E402
from eaglebox.draft.export import export_draft  # noqa: E402
from eaglebox.draft.spec import draft_spec  # noqa: E402
from eaglebox.train.checkpoint import trainable_state  # noqa: E402
from eaglebox.train.kernel_check import (  # noqa: E402
    check_inputs,
    check_kernels,
    eager,
    tensor_error,
    unroll,
    unroll_errors,
    worst,
)
from eaglebox.train.model import Eagle3Draft  # noqa: E402
from eaglebox.train.ttt import ttt_attention, ttt_steps  # noqa: E402
from eaglebox_dev.kimi_width import KIMI, target_config  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/h200-kernels")
VOCAB = 8192
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 32, "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
"""The served check's target shape (configs/h200-served.yaml), whose drafts served as trained."""
CASES = {
    "llama-8b width, llama form": (LLAMA_8B, {}),
    "kimi width, llama form": ("kimi", {}),
    "kimi width, deepseek_mla form": ("kimi", {"architecture": "deepseek_mla", "rope_scaling": {"rope_type": "default"}}),
}


def target_dir(name: str, config: dict | str) -> Path:
    d = WORK / name.split(",")[0].replace(" ", "-")
    d.mkdir(parents=True, exist_ok=True)
    if config == "kimi":
        config = target_config(VOCAB, {"bos": 1, "eos": 2, "pad": 0}, 10, KIMI)
    (d / "config.json").write_text(json.dumps(config))
    return d


def sglang_error(model, spec, name: str, device: torch.device, steps: int = 3, T: int = 256) -> list[float]:
    """Per draft position, the relative error of SGLang's draft class (exported weights, on ``device``) against
    the trainer's TTT logits, over three extend-then-chain drafts as the server runs them."""
    from eaglebox.draft.sglang_class import SGLangDraft

    with torch.no_grad():  # the whole vocabulary is the draft's: d2t all 0, t2d all true
        model.d2t.zero_()
        model.t2d.fill_(True)
    d = export_draft(WORK / name.replace(" ", "-").replace(",", "") / "draft", spec, trainable_state(model),
                     {"layer_ids": [1, 2, 3]}, torch.float32)
    sg = SGLangDraft(d, device=device)
    sg.set_embed(model.embed_tokens.weight)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab_size, (1, T), generator=g).to(device)
    aux = torch.randn(1, T, 3 * spec.target_hidden_size, generator=g).to(device)
    cuda = device.type == "cuda"
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=cuda):
        w = model.step_weights(torch.bfloat16 if cuda else torch.float32)
        h = model.project_aux(aux).to(w["o"].dtype)
        want = [(x @ w["lm_head"].T)[0].float() for x in ttt_steps(model, w, ids, h, torch.ones_like(ids, dtype=torch.bool), steps)]
    got = [[] for _ in range(steps)]
    ref = [[] for _ in range(steps)]
    for t in (8, T // 2, T - 1 - steps):
        sg.reset()
        logits, hid = sg.forward(ids[0, 1 : t + 2], aux[0, : t + 1], torch.arange(t + 1))
        got[0].append(logits[-1].float())
        ref[0].append(want[0][t])
        for i in range(1, steps):
            logits, hid = sg.forward(ids[0, t + 1 + i : t + 2 + i], hid[-1:], torch.tensor([t + i]))
            got[i].append(logits[-1].float())
            ref[i].append(want[i][t])
    return [round(tensor_error(torch.stack(a), torch.stack(b)), 5) for a, b in zip(got, ref)]


def bf16_against_fp32(model, ids: torch.Tensor, h: torch.Tensor, steps: int = 5) -> dict:
    """Where the check's bf16 disagreement sits (2026-12-08, H100: compiled blocks + flex against eager, both
    bf16, off by 1.39 on the q/k projections' gradients alone, and equal in fp32; on the CPU eager bf16 is
    within 0.9 % of fp32 there, and inductor's CPU blocks within 0.8 % of eager): each unroll against the
    eager fp32 one, and the compiled blocks with the dense attention against eager, both bf16."""
    ref = eager(model)
    blocks_dense = SimpleNamespace(token_proj=model.token_proj, qkv=model.qkv, finish=model.finish,
                                   attention=ttt_attention)
    fp32 = unroll(ref, model, torch.float32, ids, h, steps)
    runs = {"compiled_fp32_steps_worst": (model, torch.float32, fp32),  # name: kernels, dtype, reference
            "eager_bf16_vs_fp32_worst": (ref, torch.bfloat16, fp32),
            "compiled_bf16_vs_fp32_worst": (model, torch.bfloat16, fp32),
            "compiled_blocks_dense_attention_bf16_vs_eager_bf16_worst": (blocks_dense, torch.bfloat16, None)}
    out = {}
    for name, (kernels, dtype, want) in runs.items():
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=dtype == torch.bfloat16):
                got = unroll(kernels, model, dtype, ids, h, steps)
                want = want or unroll(ref, model, dtype, ids, h, steps)
            out[name] = worst(unroll_errors(model, got, want))
        except Exception as err:  # flex in fp32 at head dim 192 needs more shared memory than an H100 has (s28)
            out[name] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    for name, (config, draft) in CASES.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        spec = draft_spec(target_dir(name, config), DraftConfig(draft_vocab_size=VOCAB, **draft), num_aux=3)
        torch.manual_seed(0)
        model = Eagle3Draft(spec).cuda()
        model.compile_steps(1024)
        case = results["cases"][name] = {"head_dim": spec.head_dim, "v_head_dim": getattr(spec, "v_head_dim", None)}
        # the compiled blocks before the check may replace them: against SGLang (bf16), and against eager in fp32
        # (a disagreement there is the compiler's, not bf16 rounding's)
        case["compiled_sglang_error_per_position"] = sglang_error(model, spec, name, torch.device("cuda"))
        ids, h = check_inputs(model, torch.device("cuda"))
        case.update(bf16_against_fp32(model, ids, h))
        print(json.dumps({name: case}), flush=True)
        (OUT / "kernels.json").write_text(json.dumps(results, indent=1) + "\n")
        t0 = time.monotonic()
        case.update(check_kernels(model, 5, torch.device("cuda")), s=round(time.monotonic() - t0, 1))
        (OUT / "kernels.json").write_text(json.dumps(results, indent=1) + "\n")
        case["sglang_error_per_position"] = sglang_error(model, spec, name, torch.device("cuda"))
        print(json.dumps({name: case}), flush=True)
        (OUT / "kernels.json").write_text(json.dumps(results, indent=1) + "\n")
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
