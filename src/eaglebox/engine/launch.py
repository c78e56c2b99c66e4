"""SGLang launch arguments derived from the config, for the three ways eaglebox runs the target.

- ``plain``: the target alone (bench baseline, smoke tests).
- ``capture``: the target with EAGLE-3 aux capture and no draft, radix cache forced off (a cache hit
  would return only the uncached suffix), the eaglebox hook writing features to disk.
- ``speculative``: target + draft with ``--speculative-algorithm EAGLE3``.

All three share :func:`base_args`: the same engine flags capture the features and serve the draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from eaglebox.config import Config
from eaglebox.layers import SGLANG_CONVENTION, check_layer_ids, convert_layer_ids, default_layer_ids

Mode = Literal["plain", "capture", "speculative"]


def read_target_config(model_path: Path) -> dict:
    path = Path(model_path) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise FileNotFoundError(f"model.path: cannot read {path} ({err.strerror})") from err


def target_config(cfg: Config) -> dict:
    return read_target_config(cfg.model.path)


def text_config(model_path: Path) -> dict:
    """The language model's part of the target config (VLM wrappers such as Kimi-K2.5 nest it)."""
    hf = read_target_config(model_path)
    return hf.get("text_config", hf)


def num_layers(cfg: Config) -> int:
    return int(text_config(cfg.model.path)["num_hidden_layers"])


def sglang_layer_ids(cfg: Config) -> list[int]:
    """The aux layers in SGLang's convention (what ``--return-aux-hidden-state-layer-ids`` takes)."""
    n = num_layers(cfg)
    if cfg.capture.layer_ids is None:
        ids = default_layer_ids(n)
    else:
        ids = convert_layer_ids(cfg.capture.layer_ids, cfg.capture.convention, SGLANG_CONVENTION)
    check_layer_ids(ids, n)
    return ids


def base_args(cfg: Config) -> list[str]:
    e, m = cfg.engine, cfg.model
    args = ["--model-path", str(m.path), "--host", e.host, "--port", str(e.port), "--tp", str(m.tp),
            "--dtype", m.dtype, "--device", e.device]
    if m.quantization:
        args += ["--quantization", m.quantization]
    if e.device == "cpu":
        args += ["--disable-cuda-graph", "--sleep-on-idle"]
        if e.max_total_tokens is None:
            raise ValueError("engine.max_total_tokens: required on CPU (SGLang would take most of the RAM)")
    for flag, value in (("--attention-backend", e.attention_backend or ("torch_native" if e.device == "cpu" else None)),
                        ("--moe-runner-backend", e.moe_runner_backend),
                        ("--mem-fraction-static", e.mem_fraction_static),
                        ("--max-total-tokens", e.max_total_tokens),
                        ("--chunked-prefill-size", e.chunked_prefill_size)):
        if value is not None:
            args += [flag, str(value)]
    return args + list(e.extra_args)


def launch_args(cfg: Config, mode: Mode) -> list[str]:
    args = base_args(cfg)
    if mode == "capture":
        args += ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                 "--return-aux-hidden-state-layer-ids", *map(str, sglang_layer_ids(cfg)),
                 "--disable-radix-cache", "--skip-server-warmup"]
    elif mode == "speculative":
        s = cfg.serve
        if s.draft_path is None:
            raise ValueError("serve.draft_path: required to serve with a draft")
        args += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(s.draft_path),
                 "--speculative-num-steps", str(s.num_steps), "--speculative-eagle-topk", str(s.eagle_topk),
                 "--speculative-num-draft-tokens", str(s.num_draft_tokens),
                 "--speculative-draft-model-quantization", s.draft_quantization]
        if s.draft_attention_backend:
            args += ["--speculative-draft-attention-backend", s.draft_attention_backend]
    return args


def launch_env(cfg: Config, mode: Mode, capture_dir: Path | None = None) -> dict[str, str]:
    env = dict(cfg.engine.env)
    if cfg.engine.device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if mode == "capture":
        if capture_dir is None:
            raise ValueError("capture mode needs a capture directory")
        env["EAGLEBOX_CAPTURE_DIR"] = str(capture_dir)
        env["EAGLEBOX_CAPTURE_BUFFER_BYTES"] = str(cfg.extract.writer_buffer_mb << 20)
    return env


def server_for(cfg: Config, mode: Mode, log_path: Path, capture_dir: Path | None = None):
    """An (unstarted) :class:`SGLangServer` for ``cfg`` in ``mode``."""
    from eaglebox.engine.server import SGLangServer

    return SGLangServer(launch_args(cfg, mode), env=launch_env(cfg, mode, capture_dir), log_path=log_path,
                        host=cfg.engine.host, port=cfg.engine.port, startup_timeout_s=cfg.engine.startup_timeout_s)
