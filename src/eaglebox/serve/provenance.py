"""Refuse to serve a draft with a target or engine other than the ones whose features it was trained on."""

from __future__ import annotations

from eaglebox.config.schema import ServeConfig
from eaglebox.draft.export import check_export
from eaglebox.errors import EagleboxError
from eaglebox.shards.contract import CaptureSpec
from eaglebox.target.fingerprint import WHAT, stale


def differences(draft: dict, spec: CaptureSpec, allowed: list[str]) -> list[str]:
    """One line per item of the capture spec ``spec`` the draft's ``eaglebox`` block differs in (its
    :meth:`CaptureSpec.provenance`), naming it; engine options in ``allowed``
    (``serve.allow_engine_differences``) may differ, ``extra_args`` flag by flag (``extra_args.<name>``)."""
    recorded = spec.as_json() | {k: draft.get(k) for k in spec.provenance()}  # the layout is not the draft's
    target = draft.get("target") or {}
    stale_target = stale(target)
    out = [f"target fingerprint: the draft's was {stale_target}"] if stale_target is not None else []
    for name, (want, have) in spec.diff(recorded, allow=[f"engine_options.{k}" for k in allowed]).items():
        part, _, item = name.partition(".")
        if part == "target" and stale_target is None:
            out.append(f"target {WHAT.get(item, item)}: draft {str(have)[:12]} vs serving {str(want)[:12]} ({item})")
        elif name == "engine_options.extra_args":
            want, have = want or {}, have or {}
            out += [f"engine option extra_args.{flag}: draft {have.get(flag)!r} vs serving {want.get(flag)!r}"
                    for flag in sorted(want.keys() | have.keys())
                    if want.get(flag) != have.get(flag) and f"extra_args.{flag}" not in allowed]
        elif part == "engine_options":
            out.append(f"engine option {item or 'block'}: draft {have!r} vs serving {want!r}")
        elif part != "target":
            out.append(f"{name}: draft {have!r} vs serving {want!r}")
    return out


def check_provenance(s: ServeConfig, spec: CaptureSpec) -> dict:
    """Compare the draft's ``eaglebox`` block with ``spec``, the capture spec of the target and engine
    about to serve it (:func:`eaglebox.shards.spec.capture_spec`)."""
    draft = check_export(s.draft_path)
    prov = draft.get("eaglebox")
    if prov is None:
        raise EagleboxError(f"{s.draft_path}: config.json has no eaglebox provenance block; it was not "
                            "trained by eaglebox (set serve.allow_provenance_mismatch=true to serve it anyway)")
    diffs = differences(prov, spec, s.allow_engine_differences)
    if diffs and not s.allow_provenance_mismatch:
        raise EagleboxError(f"{s.draft_path} was trained on features this target and engine do not "
                            "produce:\n  " + "\n  ".join(diffs) +
                            "\n(re-extract and retrain; or list the engine options you accept as different in "
                            "serve.allow_engine_differences; or set serve.allow_provenance_mismatch=true)")
    return {"draft": prov, "mismatches": diffs}
