"""``eaglebox check``: the consistency gate, capture -> train -> export -> acceptance on held-out prompts;
exits non-zero with the numbers when it fails.

One capture server does all the engine work (features for training, greedy continuations and
their features for evaluation). The held-out samples are kept beside the shards (``heldout/``, keyed by
the capture spec, the prompts' ids, ``bench.max_new_tokens`` and ``extract.concurrency``): a re-run whose
capture is complete and whose key matches starts no server. The trained draft must reach ``bench.min_accept_length``; a draft
with random weights and the same vocabulary is the negative control that shows the gate can fail.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

from eaglebox.errors import EagleboxError

RANDOM_CONTROL_MAX_AL = 1.3


def run_gate(cfg, log=print) -> dict:
    from eaglebox.draft.offline import evaluate_draft
    from eaglebox.extract.collect import HELDOUT, collect, heldout_key, load_heldout
    from eaglebox.extract.commit import feature_bound, staging_dir
    from eaglebox.extract.diversity import corpus_report
    from eaglebox.extract.http import Client
    from eaglebox.extract.prompts import heldout_prompts
    from eaglebox.extract.run import capture, capture_server, captured, prepare
    from eaglebox.shards.spec import capture_spec
    from eaglebox.target.tokenizer import load_tokenizer
    from eaglebox.target.weights import load_embed_and_head
    from eaglebox.train.control import export_control_draft
    from eaglebox.train.loop import run_train

    if cfg.serve.eagle_topk != 1:
        raise EagleboxError("serve.eagle_topk: the offline gate measures chain drafting (topk 1)")
    if cfg.bench.prompts is None or cfg.bench.min_accept_length is None:
        raise EagleboxError("bench.prompts and bench.min_accept_length: required by the gate")
    spec = capture_spec(cfg)
    tok = load_tokenizer(cfg.model)
    plan = prepare(cfg.extract, spec, tok, log)
    bound = feature_bound(cfg.model.path)
    prompts = heldout_prompts(cfg, tok)
    out = Path(cfg.bench.output_dir)
    staging = staging_dir(cfg.extract)
    t0 = time.monotonic()
    timings = {}
    keep = Path(cfg.extract.output_dir) / HELDOUT
    key = heldout_key(spec, prompts, cfg.bench.max_new_tokens, cfg.extract.concurrency)
    samples = load_heldout(keep, key, prompts, spec, log) if captured(cfg.extract, spec, tok, plan, log) else None
    with ExitStack() as stack:
        if samples is not None:
            srv = None
            log(f"check: capture complete and held-out samples kept in {keep}: no server")
        else:
            srv = stack.enter_context(capture_server(cfg, spec, out / "gate-server.log"))
            timings["server_start_s"] = round(srv.startup_s, 1)
            capture(cfg.extract, srv.url, spec, tok, plan, staging, bound=bound, alive=srv.alive, log=log)
            timings["extract_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        trained = run_train(cfg, spec, log=log)
        timings["train_s"] = round(time.monotonic() - t1, 1)
        t2 = time.monotonic()
        if srv is not None:
            client = Client(srv.url, cfg.extract.max_retries, cfg.extract.retry_backoff_s, srv.alive)
            samples = collect(client, prompts, cfg.bench.max_new_tokens, staging, spec, cfg.extract.concurrency,
                              keep=keep, key=key)
    corpus = corpus_report(cfg.extract, tok)  # what the AL is measured on: how varied the target's answers are
    embed, _ = load_embed_and_head(Path(cfg.model.path))
    random_dir = export_control_draft(trained, Path(cfg.train.output_dir) / "random-draft", cfg.train.seed)
    report = {
        "trained": evaluate_draft(trained, embed, samples, cfg.serve.num_steps, spec.engine_version),
        "random_control": evaluate_draft(random_dir, embed, samples, cfg.serve.num_steps, spec.engine_version),
        "min_accept_length": cfg.bench.min_accept_length,
        "random_control_max_accept_length": RANDOM_CONTROL_MAX_AL,
        "corpus": corpus,
    }
    timings["evaluate_s"] = round(time.monotonic() - t2, 1)
    report["timings"] = timings
    report["passed"] = (report["trained"]["accept_length"] >= cfg.bench.min_accept_length
                        and report["random_control"]["accept_length"] <= RANDOM_CONTROL_MAX_AL)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def run(cfg) -> int:
    r = run_gate(cfg)
    t, c = r["trained"], r["random_control"]
    print(json.dumps({"trained_accept_length": t["accept_length"], "random_accept_length": c["accept_length"],
                      "accept_rate_per_position": t["accept_rate_per_position"], "sglang": t["engine_version"],
                      "corpus": r["corpus"], "timings": r["timings"], "passed": r["passed"]}, indent=1))
    if not r["passed"]:
        print(f"check FAILED: trained AL {t['accept_length']:.3f} (need >= {r['min_accept_length']}), "
              f"random-weights AL {c['accept_length']:.3f} (need <= {r['random_control_max_accept_length']})")
        return 1
    return 0
