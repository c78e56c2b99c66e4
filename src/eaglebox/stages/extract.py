"""``eaglebox extract``: start the capture server, run the client, stop the server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eaglebox.engine.launch import server_for
from eaglebox.errors import EagleboxError
from eaglebox.shards.spec import capture_spec


def staging_dir(cfg) -> Path:
    """Where the capture server writes samples before the client commits them to shards."""
    from eaglebox.extract.client import STAGING

    return Path(cfg.extract.output_dir) / STAGING


def capture_server(cfg, spec: dict, log_path: Path):
    """An (unstarted) capture server for ``spec``'s layers, writing to :func:`staging_dir`."""
    return server_for(cfg, "capture", log_path, capture_dir=staging_dir(cfg), layer_ids=spec["layer_ids"])


def run(cfg) -> int:
    from eaglebox.extract.client import capture, prepare
    from eaglebox.target.tokenizer import load_tokenizer

    if cfg.extract.dataset is None:
        raise EagleboxError("extract.dataset: required")
    spec = capture_spec(cfg)
    tokenizer = load_tokenizer(cfg)
    plan = prepare(cfg, spec, tokenizer)
    out = Path(cfg.extract.output_dir)
    log_path = out.parent / f"{out.name}-server.log"
    staging = staging_dir(cfg)
    srv = capture_server(cfg, spec, log_path)
    print(f"extract: starting SGLang {spec['engine_version']} (layer ids {spec['layer_ids']}: {spec['architecture']} "
          f"hooks the inputs of layers {spec['captured_layer_inputs']}); log {log_path}")
    with srv:
        print(f"extract: server healthy after {srv.startup_s:.1f} s")
        manifest = capture(cfg, srv.url, spec, tokenizer, plan, staging, alive=srv.alive)
    shutil.rmtree(staging, ignore_errors=True)  # committed samples are already removed; leftovers are recomputable
    print(f"extract: {manifest['samples']} samples, {manifest['tokens']:,} tokens in {len(manifest['shards'])} "
          f"shards at {out}")
    print(json.dumps({"capture": manifest["capture"]}, indent=1))
    return 0
