"""``eaglebox extract``: start the capture server, run the client, stop the server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eaglebox.errors import EagleboxError
from eaglebox.shards.spec import capture_spec


def run(cfg) -> int:
    from eaglebox.extract.commit import feature_bound, staging_dir
    from eaglebox.extract.diversity import corpus_report
    from eaglebox.extract.run import capture, capture_server, prepare
    from eaglebox.target.tokenizer import load_tokenizer

    if cfg.extract.dataset is None:
        raise EagleboxError("extract.dataset: required")
    spec = capture_spec(cfg)
    tokenizer = load_tokenizer(cfg.model)
    plan = prepare(cfg.extract, spec, tokenizer)
    bound = feature_bound(cfg.model.path)
    out = Path(cfg.extract.output_dir)
    log_path = out.parent / f"{out.name}-server.log"
    staging = staging_dir(cfg.extract)
    srv = capture_server(cfg, spec, log_path)
    print(f"extract: starting SGLang {spec.engine_version} (layer ids {list(spec.layers.layer_ids)}: {spec.layers.architecture} "
          f"hooks the inputs of layers {list(spec.layers.captured_layer_inputs)}); log {log_path}")
    throughput: dict = {}
    with srv:
        print(f"extract: server healthy after {srv.startup_s:.1f} s")
        manifest = capture(cfg.extract, srv.url, spec, tokenizer, plan, staging, bound=bound, alive=srv.alive,
                           report=throughput)
    shutil.rmtree(staging, ignore_errors=True)  # committed samples are already removed; leftovers are recomputable
    print(f"extract: {manifest['samples']} samples, {manifest['tokens']:,} tokens in {len(manifest['shards'])} "
          f"shards at {out}")
    print(json.dumps({"capture": manifest["capture"], "throughput": throughput, "corpus": corpus_report(cfg.extract, tokenizer)},
                     indent=1))
    return 0
