"""``eaglebox extract``: start the capture server, run the client, stop the server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eaglebox.engine.launch import server_for
from eaglebox.errors import EagleboxError
from eaglebox.shards.capture import CaptureSpec
from eaglebox.shards.spec import capture_spec


def staging_dir(cfg) -> Path:
    """Where the capture server writes samples before the client commits them to shards."""
    from eaglebox.extract.commit import STAGING

    return Path(cfg.extract.output_dir) / STAGING


def capture_server(cfg, spec: CaptureSpec, log_path: Path):
    """An (unstarted) capture server for ``spec``'s layers, writing to :func:`staging_dir` samples that
    record ``spec`` (:meth:`CaptureSpec.sample_header`)."""
    return server_for(cfg, "capture", log_path, capture_dir=staging_dir(cfg), layer_ids=list(spec.layers.layer_ids),
                      sample_header=spec.sample_header())


CORPUS = "corpus.json"
"""The answers' corpus numbers (:func:`corpus_report`), beside the shards."""


def shard_answers(reader, tokenizer) -> list[str]:
    """Every answer in the shards, as text: each run of loss-masked tokens of each sample, decoded
    without special tokens (the target's own answers when extraction regenerated them)."""
    import torch

    out = []
    for i in range(len(reader)):
        ids, mask = reader.ids_and_mask(i)
        m = torch.cat([torch.zeros(1, dtype=torch.bool), mask.bool(), torch.zeros(1, dtype=torch.bool)])
        edges = (m[1:] != m[:-1]).nonzero().flatten().tolist()
        for a, b in zip(edges[::2], edges[1::2]):
            out.append(tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=True))
    return out


def corpus_report(cfg, tokenizer) -> dict:
    """How varied the shards' answers are (:func:`eaglebox.extract.diversity.answer_stats`: distinct-answer
    ratio, share of answers dominated by their longest repeated n-gram); written to ``corpus.json`` in
    ``extract.output_dir`` and returned."""
    from eaglebox.extract.diversity import answer_stats
    from eaglebox.shards.format import ShardReader

    out = Path(cfg.extract.output_dir)
    report = {"regenerated": cfg.extract.regenerate, **answer_stats(shard_answers(ShardReader(out), tokenizer))}
    (out / CORPUS).write_text(json.dumps(report, indent=1) + "\n")
    return report


def run(cfg) -> int:
    from eaglebox.extract.run import capture, prepare
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
    print(f"extract: starting SGLang {spec.engine_version} (layer ids {list(spec.layers.layer_ids)}: {spec.layers.architecture} "
          f"hooks the inputs of layers {list(spec.layers.captured_layer_inputs)}); log {log_path}")
    throughput: dict = {}
    with srv:
        print(f"extract: server healthy after {srv.startup_s:.1f} s")
        manifest = capture(cfg, srv.url, spec, tokenizer, plan, staging, alive=srv.alive, report=throughput)
    shutil.rmtree(staging, ignore_errors=True)  # committed samples are already removed; leftovers are recomputable
    print(f"extract: {manifest['samples']} samples, {manifest['tokens']:,} tokens in {len(manifest['shards'])} "
          f"shards at {out}")
    print(json.dumps({"capture": manifest["capture"], "throughput": throughput, "corpus": corpus_report(cfg, tokenizer)},
                     indent=1))
    return 0
