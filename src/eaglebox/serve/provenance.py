"""Refuse to serve a draft with a target or engine other than the ones whose features it was trained on."""

from __future__ import annotations

from eaglebox.draft.sglang import check_export
from eaglebox.errors import EagleboxError
from eaglebox.target.fingerprint import WHAT, stale

SAME = ("engine", "engine_version", "architecture", "layer_ids", "captured_layer_inputs")
"""What a draft's ``eaglebox`` block must share with the capture spec of the serving launch, besides
the target's fingerprint (``target``) and the engine options (``engine_options``)."""


def differences(draft: dict, spec: dict, allowed: list[str]) -> list[str]:
    """One line per item of the capture spec ``spec`` the draft's block differs in, naming it; engine
    options in ``allowed`` (``serve.allow_engine_differences``) may differ."""
    out = [f"{k}: draft {draft.get(k)!r} vs serving {spec[k]!r}" for k in SAME if draft.get(k) != spec[k]]
    target = draft.get("target") or {}
    if (why := stale(target)) is not None:
        out.append(f"target fingerprint: the draft's was {why}")
    else:
        out += [f"target {WHAT[k]}: draft {str(target.get(k))[:12]} vs serving {v[:12]} ({k})"
                for k, v in spec["target"].items() if target.get(k) != v]
    options, serving = draft.get("engine_options") or {}, spec["engine_options"]
    out += [f"engine option {k}: draft {options.get(k)!r} vs serving {serving.get(k)!r}"
            for k in [*serving, *sorted(options.keys() - serving.keys())]
            if k not in allowed and options.get(k) != serving.get(k)]
    return out


def check_provenance(cfg, spec: dict) -> dict:
    """Compare the draft's ``eaglebox`` block with ``spec``, the capture spec of the target and engine
    about to serve it (:func:`eaglebox.shards.spec.capture_spec`)."""
    draft = check_export(cfg.serve.draft_path)
    prov = draft.get("eaglebox")
    if prov is None:
        raise EagleboxError(f"{cfg.serve.draft_path}: config.json has no eaglebox provenance block; it was not "
                            "trained by eaglebox (set serve.allow_provenance_mismatch=true to serve it anyway)")
    diffs = differences(prov, spec, cfg.serve.allow_engine_differences)
    if diffs and not cfg.serve.allow_provenance_mismatch:
        raise EagleboxError(f"{cfg.serve.draft_path} was trained on features this target and engine do not "
                            "produce:\n  " + "\n  ".join(diffs) +
                            "\n(re-extract and retrain; or list the engine options you accept as different in "
                            "serve.allow_engine_differences; or set serve.allow_provenance_mismatch=true)")
    return {"draft": prov, "mismatches": diffs}
