"""``eaglebox export``: the SGLang draft directory from the newest checkpoint (training does this at its end)."""

import json
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
    if cfg.train.data == "offline":
        reader = ShardReader(cfg.extract.output_dir)
        prov, num_aux = provenance(reader, cfg.train.ttt_length), len(reader.capture.layers.layer_ids)
    else:  # online or hybrid: what the trainer recorded of its samples (there are no shards)
        from eaglebox.train.loop import DATA_PROVENANCE

        path = Path(cfg.train.output_dir) / DATA_PROVENANCE
        if not path.exists():
            raise EagleboxError(f"{path}: missing; it is written when `eaglebox train` starts with train.data: "
                                f"{cfg.train.data}")
        prov = json.loads(path.read_text())
        num_aux = len(prov["layer_ids"])
    spec = draft_spec(cfg.model.path, cfg.train.draft, num_aux)
    out = export_draft(Path(cfg.train.output_dir) / "draft", spec, load_file(ckpt / "model.safetensors"), prov)
    print(f"export: {ckpt} -> {out}")
    return 0
