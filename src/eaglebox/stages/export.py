"""``eaglebox export``: the SGLang draft directory from the newest checkpoint (training does this at its end)."""

from pathlib import Path

from eaglebox.errors import EagleboxError


def run(cfg) -> int:
    from safetensors.torch import load_file

    from eaglebox.draft.export import export_draft, provenance
    from eaglebox.draft.spec import draft_spec
    from eaglebox.shards.format import ShardReader
    from eaglebox.train import checkpoint

    ckpt = checkpoint.latest(Path(cfg.train.output_dir) / "checkpoints")
    if ckpt is None:
        raise EagleboxError(f"{cfg.train.output_dir}/checkpoints: no checkpoint; run `eaglebox train` first")
    reader = ShardReader(cfg.extract.output_dir)
    spec = draft_spec(cfg.model.path, cfg.train.draft, len(reader.capture.layers.layer_ids))
    out = export_draft(Path(cfg.train.output_dir) / "draft", spec, load_file(ckpt / "model.safetensors"),
                       provenance(reader, cfg.train.ttt_length))
    print(f"export: {ckpt} -> {out}")
    return 0
