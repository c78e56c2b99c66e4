"""The capture contract ("train as you infer") as one type: what determines the features.

Shards record it (manifest ``capture``, every shard index, every sample's header) and a draft keeps
it (its ``eaglebox`` block); extraction resume, staged and committed samples, shard indexes, training
and serving all compare two copies with :meth:`CaptureSpec.diff`, so a field added here is recorded
and compared everywhere. On disk it is the flat JSON object eaglebox has always written.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from eaglebox.errors import EagleboxError

REEXTRACT = "extract again into an empty extract.output_dir with this eaglebox"
LAYOUT = {"layout": True}
"""Marks a field that describes the feature files' layout, implied by the target and the engine
options; a draft's provenance leaves it out (drafts before this type did not record it)."""
SERVER_OBSERVES = frozenset({"engine", "engine_version", "captured_layer_inputs"})
"""What a capture server reports from the running engine itself; a sample header holding only these
was written by a server that was not given the spec (or before it was)."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _without_none(values: dict) -> dict:
    return {k: v for k, v in values.items() if v is not None}


class TargetFingerprint(Frozen):
    """The target's identity (:func:`eaglebox.target.fingerprint.target_fingerprint`)."""

    config_sha256: str
    tokenizer_sha256: str
    weights_digest: str | None = None
    weights_algorithm: str | None = None
    weights_sha256: str | None = None
    """An older eaglebox's sampled weights hash: kept so its files load and are named stale."""

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        return _without_none(handler(self))  # the keys the fingerprint was made with, nothing else


class EngineOptions(Frozen):
    """The launch options that change hidden states (:func:`eaglebox.engine.launch.hidden_state_options`)."""

    quantization: str | None
    dtype: str
    attention_backend: str | None
    moe_runner_backend: str | None
    kv_cache_dtype: str | None
    tp: int
    dp: int
    ep: int
    extra_args: dict[str, Any] | None = None
    """Options set through ``engine.extra_args``; absent when none were."""

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = handler(self)
        if out.get("extra_args") is None:
            out.pop("extra_args", None)
        return out


class Layers(Frozen):
    """``layer_ids``: what SGLang is given (capture flag, draft config); ``captured_layer_inputs``: the
    layers whose inputs the target class then hooks, by its architecture's ``layer_rule``."""

    architecture: str
    layer_rule: str
    layer_ids: tuple[int, ...]
    captured_layer_inputs: tuple[int, ...]


class CaptureSpec(Frozen):
    """The engine, the layers, the target and the options that make its hidden states; the feature
    files' layout. On disk the layer fields sit at the top level, as eaglebox has always written them."""

    engine: str
    engine_version: str
    layers: Layers
    hidden_size: int = Field(json_schema_extra=LAYOUT)
    num_layers: int = Field(json_schema_extra=LAYOUT)
    dtype: str = Field(json_schema_extra=LAYOUT)
    dtype_bytes: int = Field(json_schema_extra=LAYOUT)
    target: TargetFingerprint
    engine_options: EngineOptions

    @model_validator(mode="before")
    @classmethod
    def _nest_layers(cls, data):
        """Files hold the layer fields at the top level."""
        part = cls.model_fields["layers"].annotation.model_fields
        if isinstance(data, dict) and "layers" not in data:
            data = {k: v for k, v in data.items() if k not in part} | {"layers": {k: data[k] for k in part if k in data}}
        return data

    @model_serializer(mode="wrap")
    def _flat_layers(self, handler):
        out = handler(self)
        return {k: v for k, v in out.items() if k != "layers"} | out["layers"]

    @classmethod
    def load(cls, recorded: dict, where) -> CaptureSpec:
        """A spec read from a file; one the type does not accept is refused in one line."""
        try:
            return cls.model_validate(recorded)
        except ValidationError as err:
            bad = ", ".join(sorted({".".join(map(str, e["loc"])) for e in err.errors()}))
            raise EagleboxError(f"{where}: its capture spec was written by another eaglebox ({bad} not as this "
                                f"one records them); {REEXTRACT}") from None

    def as_json(self) -> dict:
        """The JSON object recorded in the manifest and each shard index."""
        return self.model_dump(mode="json")

    def sample_header(self) -> dict:
        """What the capture server writes into every sample: all of it, so each sample is checked on
        every field (the server puts its own observations in place of :data:`SERVER_OBSERVES`)."""
        return self.as_json()

    def provenance(self) -> dict:
        """What a draft keeps of the spec of the features it was trained on: all but the layout."""
        layout = {k for k, f in type(self).model_fields.items() if (f.json_schema_extra or {}).get("layout")}
        return {k: v for k, v in self.as_json().items() if k not in layout}

    def digest_json(self) -> str:
        """The canonical text of the spec (sample ids are content addresses over it)."""
        return json.dumps(self.as_json(), sort_keys=True)

    def diff(self, other: CaptureSpec | dict, allow=()) -> dict[str, tuple[Any, Any]]:
        """Every difference from ``other`` (a spec, or a recorded JSON object), by dotted field name
        (``engine_options.tp``, ``target.weights_digest``), sorted, with (this value, the other's);
        names in ``allow``, or under them, are left out."""
        theirs = other.as_json() if isinstance(other, CaptureSpec) else other
        found = _diff(self, self.as_json(), theirs, "")
        return {k: v for k, v in found.items() if not any(k == a or k.startswith(f"{a}.") for a in allow)}

    def diff_sample_header(self, recorded: dict) -> dict[str, tuple[Any, Any]]:
        """:meth:`diff` against a sample's header; one holding only :data:`SERVER_OBSERVES` (a server
        not given the spec, or files written before it was) is compared on what it holds."""
        found = self.diff(recorded)
        if recorded.keys() <= SERVER_OBSERVES:
            return {k: v for k, v in found.items() if k in recorded}
        return found


def _diff(model: BaseModel, mine: dict, theirs: dict, prefix: str) -> dict[str, tuple[Any, Any]]:
    out = {}
    for key in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(key), theirs.get(key)
        part = getattr(model, key, None)
        if isinstance(part, BaseModel) and isinstance(b, dict):
            out |= _diff(part, a, b, f"{prefix}{key}.")
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def describe(diffs: dict[str, tuple[Any, Any]], side: int) -> str:
    """``name=value, ...`` for one side (0: this spec, 1: the other) of :meth:`CaptureSpec.diff`."""
    return ", ".join(f"{k}={v[side]!r}" for k, v in diffs.items())
