"""Refuse to serve a draft with a target other than the one whose features it was trained on."""

from __future__ import annotations

from eaglebox.draft.sglang import check_export
from eaglebox.errors import EagleboxError

SERVING_KEYS = ("engine", "engine_version", "layer_ids", "convention", "target_config_sha256", "quantization")
"""What a draft's ``eaglebox`` block must share with the capture spec of the target about to serve it."""


def check_provenance(cfg, spec: dict) -> dict:
    """Compare the draft's ``eaglebox`` block with ``spec``, the capture spec of the target and engine
    about to serve it (:func:`eaglebox.shards.spec.capture_spec`)."""
    draft = check_export(cfg.serve.draft_path)
    prov = draft.get("eaglebox")
    if prov is None:
        raise EagleboxError(f"{cfg.serve.draft_path}: config.json has no eaglebox provenance block; it was not "
                            "trained by eaglebox (set serve.allow_provenance_mismatch=true to serve it anyway)")
    now = {k: spec[k] for k in SERVING_KEYS}
    diffs = [f"{k}: draft {prov.get(k)!r} vs serving {v!r}" for k, v in now.items() if prov.get(k) != v]
    if diffs and not cfg.serve.allow_provenance_mismatch:
        raise EagleboxError(f"{cfg.serve.draft_path} was trained on features this target and engine do not "
                            "produce:\n  " + "\n  ".join(diffs) +
                            "\n(re-extract and retrain, or set serve.allow_provenance_mismatch=true)")
    return {"draft": prov, "serving": now, "mismatches": diffs}
