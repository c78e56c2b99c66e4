"""``eaglebox bench``: served AL and tok/s against the target alone, side by side in alternating rounds
(or of a running server, ``bench.url``); ``bench.min_accept_length`` gates."""

import json
from pathlib import Path

from eaglebox.errors import EagleboxError


def run(cfg) -> int:
    from eaglebox.bench.rounds import Bench
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.serve.provenance import check_provenance
    from eaglebox.shards.spec import capture_spec
    from eaglebox.target.tokenizer import load_tokenizer
    from eaglebox.train.control import export_control_draft

    if cfg.serve.draft_path is None or cfg.bench.prompts is None:
        raise EagleboxError("serve.draft_path and bench.prompts: required to bench")
    check_provenance(cfg.serve, capture_spec(cfg))
    prompts = heldout_prompts(cfg, load_tokenizer(cfg.model))
    out = Path(cfg.bench.output_dir)
    control = None
    if cfg.bench.control and not cfg.bench.url:
        control = export_control_draft(cfg.serve.draft_path, out / "control-draft", cfg.train.seed)
    r = Bench(cfg, prompts, out, control).run()
    a = r["acceptance"]
    print(json.dumps({"sglang": r["engine_version"], "device": r["device"], "accept_length": a["accept_length"],
                      "accept_rate_per_position": a["accept_rate_per_position"],
                      "outputs_equal_target_greedy": r["outputs_equal_target_greedy"],
                      "best_chain_per_concurrency": r["summary"]["best_chain_per_concurrency"]}, indent=1))
    gate = cfg.bench.min_accept_length
    if gate is not None and (a["accept_length"] or 0) < gate:
        print(f"bench FAILED: AL {a['accept_length']} < bench.min_accept_length {gate}")
        return 1
    return 0
