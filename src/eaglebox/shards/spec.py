"""The capture spec: everything that determines the features, recorded in every shard and manifest.

A command computes it once (:func:`capture_spec`, which picks the layer ids) and passes it on: to
the capture server's launch, the client, the trainer's shard check and the serve-time provenance check.
"""

from __future__ import annotations

import importlib.metadata

from eaglebox.config import Config
from eaglebox.target.config import config_sha256, target_dtype, text_config
from eaglebox.target.layers import SGLANG_CONVENTION, convert_layer_ids, sglang_layer_ids

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
NOT_INSTALLED = "not-installed"  # engine_version where SGLang is absent


def engine_version() -> str:
    """The installed SGLang's version, read from package metadata (importing SGLang takes seconds)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def capture_spec(cfg: Config) -> dict:
    text = text_config(cfg.model.path)
    ids = sglang_layer_ids(cfg)
    dtype = target_dtype(cfg.model.path, cfg.model.dtype)
    return {
        "engine": "sglang",
        "engine_version": engine_version(),
        "layer_ids": ids,
        "convention": SGLANG_CONVENTION,
        "captured_layer_inputs": convert_layer_ids(ids, SGLANG_CONVENTION, "input_of_layer"),
        "hidden_size": int(text["hidden_size"]),
        "num_layers": int(text["num_hidden_layers"]),
        "dtype": dtype,
        "dtype_bytes": DTYPE_BYTES[dtype],
        "quantization": cfg.model.quantization,
        "tp": cfg.model.tp,
        "target_config_sha256": config_sha256(cfg.model.path),
    }
