"""Refuse to serve a draft with a target other than the one whose features it was trained on."""

from __future__ import annotations

import hashlib
from pathlib import Path

from eaglebox.capture.spec import engine_version
from eaglebox.engine.launch import sglang_layer_ids
from eaglebox.errors import EagleboxError
from eaglebox.export.sglang import check_export


def check_provenance(cfg) -> dict:
    """Compare the draft's ``eaglebox`` block with the target and engine about to serve it."""
    draft = check_export(cfg.serve.draft_path)
    prov = draft.get("eaglebox")
    if prov is None:
        raise EagleboxError(f"{cfg.serve.draft_path}: config.json has no eaglebox provenance block; it was not "
                            "trained by eaglebox (set serve.allow_provenance_mismatch=true to serve it anyway)")
    target_sha = hashlib.sha256((Path(cfg.model.path) / "config.json").read_bytes()).hexdigest()
    now = {"engine": "sglang", "engine_version": engine_version(), "layer_ids": sglang_layer_ids(cfg),
           "convention": "output_of_layer", "target_config_sha256": target_sha,
           "quantization": cfg.model.quantization}
    diffs = [f"{k}: draft {prov.get(k)!r} vs serving {v!r}" for k, v in now.items() if prov.get(k) != v]
    if diffs and not cfg.serve.allow_provenance_mismatch:
        raise EagleboxError(f"{cfg.serve.draft_path} was trained on features this target and engine do not "
                            "produce:\n  " + "\n  ".join(diffs) +
                            "\n(re-extract and retrain, or set serve.allow_provenance_mismatch=true)")
    return {"draft": prov, "serving": now, "mismatches": diffs}
