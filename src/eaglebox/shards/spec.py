"""The capture spec of a config (:class:`eaglebox.shards.contract.CaptureSpec`).

A command computes it once (:func:`capture_spec`, which picks the layer ids) and passes it on: to
the capture server's launch, the client, the trainer's shard check and the serve-time provenance check.
"""

from __future__ import annotations

import importlib.metadata

from eaglebox.config import Config
from eaglebox.engine.launch import hidden_state_options
from eaglebox.shards.contract import CaptureSpec
from eaglebox.target.config import target_dtype, text_config
from eaglebox.target.fingerprint import target_fingerprint
from eaglebox.target.layers import captured_inputs, layer_rule, sglang_layer_ids

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
NOT_INSTALLED = "not-installed"  # engine_version where SGLang is absent


def engine_version() -> str:
    """The installed SGLang's version, read from package metadata (importing SGLang takes seconds)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def capture_spec(cfg: Config) -> CaptureSpec:
    """The spec ``cfg`` captures with: the layer ids it picks, the target's fingerprint, the installed
    engine and the launch options that change hidden states."""
    text = text_config(cfg.model.path)
    arch, rule = layer_rule(cfg.model.path)
    ids = sglang_layer_ids(cfg)
    dtype = target_dtype(cfg.model.path, cfg.model.dtype)
    return CaptureSpec.model_validate({
        "engine": "sglang",
        "engine_version": engine_version(),
        "architecture": arch,
        "layer_rule": rule,
        "layer_ids": ids,
        "captured_layer_inputs": captured_inputs(rule, ids, int(text["num_hidden_layers"])),
        "hidden_size": int(text["hidden_size"]),
        "num_layers": int(text["num_hidden_layers"]),
        "dtype": dtype,
        "dtype_bytes": DTYPE_BYTES[dtype],
        "target": target_fingerprint(cfg.model.path),
        "engine_options": hidden_state_options(cfg),
    })
