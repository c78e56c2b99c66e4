"""GPU, issues 41 and 39: the trainer's CUDA kernels against its eager references at the served drafts' shapes.

The Kimi check's first GPU run (``benchmarks/results/kimi-h100-2026-12-07-s26/``) trained both draft forms
to 0.36 accuracy at the second draft position while SGLang's draft class accepted 0.01 there; the served
check's Llama-8B-width draft (head dim 128) accepted 0.5-0.6. The Kimi drafts' attention head dims are 112
(Llama form) and 192/128 (MLA form), not powers of two. This runs ``eaglebox.train.kernel_check`` (what
every CUDA ``eaglebox train`` now runs before its first step) on random drafts of the three shapes, with
the training configs' ``max_length`` and TTT length, and prints each measurement; about a minute.

    bash tools/h200/run.sh kernels
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from eaglebox.config.schema import DraftConfig  # noqa: E402
from eaglebox.draft.spec import draft_spec  # noqa: E402
from eaglebox.train.kernel_check import check_kernels  # noqa: E402
from eaglebox.train.model import Eagle3Draft  # noqa: E402
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


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    for name, (config, draft) in CASES.items():
        spec = draft_spec(target_dir(name, config), DraftConfig(draft_vocab_size=VOCAB, **draft), num_aux=3)
        torch.manual_seed(0)
        model = Eagle3Draft(spec).cuda()
        model.compile_steps(1024)
        t0 = time.monotonic()
        r = check_kernels(model, 5, torch.device("cuda"))
        results["cases"][name] = {"head_dim": spec.head_dim, "v_head_dim": getattr(spec, "v_head_dim", None),
                                  **r, "s": round(time.monotonic() - t0, 1)}
        print(json.dumps({name: results["cases"][name]}), flush=True)
        (OUT / "kernels.json").write_text(json.dumps(results, indent=1) + "\n")
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
