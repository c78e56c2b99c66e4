"""SGLang launch arguments derived from the config, for the three ways eaglebox runs the target.

- ``plain``: the target alone (bench baseline, smoke tests).
- ``capture``: the target with EAGLE-3 aux capture and no draft, radix cache forced off (a cache hit
  would return only the uncached suffix), the eaglebox hook writing features to disk.
- ``speculative``: target + draft with ``--speculative-algorithm EAGLE3``.

All three share :func:`base_args`: the same engine flags capture the features and serve the draft;
:func:`hidden_state_options` is what of them the capture spec records. Capture takes the layer ids
the command computed (``capture_spec(cfg).layers.layer_ids``); the target is read only for its
attention kind (the CPU backend) and dtype.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Literal

from eaglebox import SGLANG_VERSION
from eaglebox.config import Config
from eaglebox.config.schema import KEYED_FLAGS, EngineConfig
from eaglebox.errors import EagleboxError
from eaglebox.target.config import architecture, is_mla, num_layers, target_dtype
from eaglebox.target.layers import captured_inputs, layer_rule

Mode = Literal["plain", "capture", "speculative"]


def attention_backend(cfg: Config) -> str | None:
    """``engine.attention_backend``, or on CPU the backend that computes the target's attention
    correctly: ``torch_native``, or ``triton`` (run by Triton's interpreter, exact in float32) for MLA,
    whose latent KV cache ``torch_native`` reads as plain heads (captured features at cos ~0.1 with
    HF, and SGLang serves on without a warning). Triton in another dtype on CPU is refused for every
    architecture (a Llama target's features came out at cos 0.04 with HF, values up to 2e9 where the
    real ones stay under 3). None on CUDA lets SGLang choose."""
    e, m = cfg.engine, cfg.model
    if e.device != "cpu":
        return e.attention_backend
    mla = is_mla(m.path)
    backend = e.attention_backend or ("triton" if mla else "torch_native")
    arch = architecture(m.path)
    if mla and backend == "torch_native":
        raise EagleboxError(f"engine.attention_backend: torch_native computes {arch}'s MLA attention wrongly on CPU "
                            "(SGLang 0.5.23 runs plain-head attention over the latent KV cache: captured features "
                            "at cos ~0.1 with the HF forward, and no warning); leave engine.attention_backend unset "
                            "or set it to triton, with model.dtype=float32")
    dtype = target_dtype(m.path, m.dtype)
    if backend == "triton" and dtype != "float32":
        fix = "" if mla else " (or engine.attention_backend=torch_native)"
        raise EagleboxError(f"model.dtype: {dtype} with the triton attention backend on CPU ({arch}"
                            f"{' is MLA' if mla else ''}): Triton's interpreter is exact in float32 only (in {dtype} "
                            f"it computes garbage features without a warning); set model.dtype=float32{fix}")
    return backend


class _SGLangArgs(argparse.ArgumentParser):
    """SGLang's own server argument parser, whose errors are eaglebox's one-line errors."""

    def error(self, message: str):
        raise EagleboxError(f"engine.extra_args: SGLang {SGLANG_VERSION} refuses them: {message}")


@functools.cache
def _sglang_parser() -> tuple[_SGLangArgs, dict]:
    """SGLang's parser (``ServerArgs.add_cli_args``, as ``launch_server`` builds it) and its defaults."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as err:
        raise EagleboxError(f"engine.extra_args: SGLang is not installed here to read them ({err}); run where "
                            f"SGLang {SGLANG_VERSION} is (the eaglebox image)") from None
    parser = _SGLangArgs(prog="sglang")
    ServerArgs.add_cli_args(parser)
    return parser, vars(parser.parse_args(["--model-path", "-"]))


BACKEND_KEYS = {"engine.attention_backend": "--attention-backend", "engine.moe_runner_backend": "--moe-runner-backend"}
"""The backend names eaglebox passes to SGLang that its parser lists choices for (its
``--speculative-draft-attention-backend`` lists none), checked before a server starts."""


@functools.cache
def _choices(flag: str) -> tuple[str, ...]:
    return tuple(_sglang_parser()[0]._option_string_actions[flag].choices)


def check_backends(e: EngineConfig) -> None:
    """Refuse a backend name SGLang would refuse only after its server started (``Triton`` for ``triton``)."""
    values = {"engine.attention_backend": e.attention_backend, "engine.moe_runner_backend": e.moe_runner_backend}
    for key, value in values.items():
        if value is None:
            continue
        choices = _choices(BACKEND_KEYS[key])
        if value in choices:
            continue
        same = [c for c in choices if c.lower() == value.lower()]
        fix = f"write {same[0]!r}" if same else f"choose one of {', '.join(choices)}"
        raise EagleboxError(f"{key}: {value!r} is not a choice of SGLang {SGLANG_VERSION}'s {BACKEND_KEYS[key]}; {fix}")


OWN_OPTIONS = {"enable_return_aux_hidden_states": "capture.layer_ids",
               "return_aux_hidden_state_layer_ids": "capture.layer_ids", "host": "engine.host", "port": "engine.port",
               "max_total_tokens": "engine.max_total_tokens", "mem_fraction_static": "engine.mem_fraction_static",
               "chunked_prefill_size": "engine.chunked_prefill_size"}
"""SGLang options (by name) that eaglebox sets from its own keys, besides :data:`KEYED_FLAGS`' and the
``speculative_*`` ones (``serve.*``, per mode)."""


@functools.cache
def _extra_options(extra_args: tuple[str, ...]) -> dict:
    parser, defaults = _sglang_parser()
    given = vars(parser.parse_args(["--model-path", "-", *extra_args]))
    keyed = {parser._option_string_actions[flag].dest: key for flag, key in KEYED_FLAGS.items()
             if flag in parser._option_string_actions}
    out = {}
    for dest, value in given.items():
        if value == defaults[dest]:
            continue
        owner = keyed.get(dest) or OWN_OPTIONS.get(dest) or ("serve.*" if dest.startswith("speculative_") else None)
        if dest == "model_path" or owner:
            raise EagleboxError(f"engine.extra_args: {' '.join(extra_args)} sets SGLang's {dest}, which eaglebox "
                                f"sets from {owner or 'model.path'}; set that key instead")
        out[dest] = value
    return json.loads(json.dumps(out, default=str, sort_keys=True))


def extra_options(e: EngineConfig) -> dict:
    """What ``engine.extra_args`` set, read by SGLang's own parser as ``launch_server`` reads them
    (abbreviations included): every option given a value other than its default, by SGLang's name.
    All are recorded (a prefill or decode attention backend, a MoE or quantisation flag, a parallelism
    size: any may change the hidden states); options eaglebox sets from its own keys, and anything
    SGLang does not parse, are refused."""
    return _extra_options(tuple(e.extra_args)) if e.extra_args else {}


DP_ATTENTION_OPTIONS = ("enable_dp_attention", "attn_dp_size")
"""SGLang 0.5.23's two spellings of DP attention: ``--attn-dp-size N``, and the deprecated ``--dp-size N
--enable-dp-attention`` (``model.dp`` is ``--dp-size``), which SGLang turns into ``--attn-dp-size N
--dp-size 1`` before anything reads the layout (``arg_groups/parallel_hook.handle_deprecated_dp_attention``)."""


@functools.cache
def _attention_dp_size(tp: int, dp: int, extra_args: tuple[str, ...]) -> int:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.parallel_hook import handle_deprecated_dp_attention
    from sglang.srt.server_args import ServerArgs

    parser, _ = _sglang_parser()
    args = ServerArgs.from_cli_args(parser.parse_args(["--model-path", "-", "--tp", str(tp), "--dp-size", str(dp),
                                                       *extra_args]))
    handle_deprecated_dp_attention(args)
    return resolving_view(args).attn_dp_size


def attention_dp_size(cfg: Config) -> int:
    """The number of attention-DP groups SGLang runs with these settings, resolved by SGLang's own rule
    (1 without DP attention). DP attention works with eaglebox: the capture writes from each group's
    first rank (``capture/hook.py``), every rank checks the served draft's layers
    (``capture/serve_check.py``), and the bench's AL is per request (each request runs in one group).
    Refused here, before any server starts: ``--enable-dp-attention`` with ``model.dp`` 1, which SGLang
    turns into one group, i.e. no DP attention (all one GPU allows); and a width that does not divide
    ``model.tp`` (SGLang asserts it in every scheduler process)."""
    m = cfg.model
    given = extra_options(cfg.engine).keys() & DP_ATTENTION_OPTIONS
    if not given:
        return 1
    size = _attention_dp_size(m.tp, m.dp, tuple(cfg.engine.extra_args))
    if size == 1 and "enable_dp_attention" in given:
        raise EagleboxError(
            "engine.extra_args: --enable-dp-attention with model.dp 1 does nothing: SGLang "
            f"{SGLANG_VERSION} makes it --attn-dp-size <model.dp>, one attention group, no DP attention. Set "
            "model.dp to the number of attention-DP groups, a divisor of model.tp (Kimi on 8 GPUs: model.tp 8, "
            "model.dp 8), or drop the flag; on one GPU DP attention cannot run")
    if m.tp % size:
        raise EagleboxError(
            f"engine.extra_args: DP attention with {size} attention groups needs model.tp divisible by {size} "
            f"(each group is model.tp / {size} GPUs), model.tp is {m.tp}; SGLang {SGLANG_VERSION} would stop "
            "in every scheduler process")
    return size


PP_PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"
"""The environment variable by which SGLang 0.5.23 takes an uneven pipeline split (``get_pp_indices``)."""


def pipeline_stages(layers: int, pp_size: int, env: dict[str, str]) -> list[tuple[int, int]]:
    """Each pipeline stage's layers ``[start, end)``, split by SGLang's own ``get_pp_indices`` with
    :data:`PP_PARTITION_ENV` as the server would see it (``engine.env`` over this process's)."""
    from sglang.srt.distributed import get_pp_indices

    saved = os.environ.get(PP_PARTITION_ENV)
    if PP_PARTITION_ENV in env:
        os.environ[PP_PARTITION_ENV] = env[PP_PARTITION_ENV]
    try:
        return [tuple(get_pp_indices(layers, rank, pp_size)) for rank in range(pp_size)]
    finally:
        if saved is None:
            os.environ.pop(PP_PARTITION_ENV, None)
        else:
            os.environ[PP_PARTITION_ENV] = saved


def check_capture_pipeline(cfg: Config, layer_ids: list[int]) -> None:
    """Refuse a capture under pipeline parallelism (``--pp-size`` > 1 in ``engine.extra_args``), before a
    server starts: SGLang 0.5.23 delivers no features there. Only the last stage hooks layers
    (``set_eagle3_layers_to_capture`` returns on the others), a stage passes the next one only its
    residual stream (``to_pp``), not aux hidden states, and every stage, the last too, processes results
    rebuilt from the pipeline's output ring without hidden states (``get_logprob_from_pp_outputs``);
    SGLang itself refuses ``--enable-return-aux-hidden-states`` with ``pp_size != 1``. Serving a draft
    under pipeline parallelism is not refused (``capture/serve_check.py``)."""
    pp = int(extra_options(cfg.engine).get("pp_size", 1))
    if pp == 1:
        return
    arch, rule = layer_rule(cfg.model.path)
    n = num_layers(cfg.model.path)
    inputs = captured_inputs(rule, layer_ids, n)
    try:
        stages = pipeline_stages(n, pp, cfg.engine.env)
        split = ", ".join(f"stage {r}: layers {a}-{b - 1}" for r, (a, b) in enumerate(stages))
        where = [next(r for r, (a, b) in enumerate(stages) if a <= i < b) for i in inputs]
        placed = f"[{split}]; the capture hooks the inputs of layers {inputs}, on stages {where}"
    except ValueError as err:  # SGLANG_PP_LAYER_PARTITION that SGLang refuses
        placed = f"no split ({err}); the capture hooks the inputs of layers {inputs}"
    gpus = cfg.model.tp * pp
    raise EagleboxError(
        f"engine.extra_args: --pp-size {pp} cannot capture features: SGLang {SGLANG_VERSION} splits {arch}'s {n} "
        f"layers into {pp} stages (get_pp_indices) {placed}. Only the last stage hooks layers, a stage passes the "
        "next one its residual stream but no aux hidden states, and no stage gets hidden states back from the "
        "pipeline's output ring; SGLang refuses --enable-return-aux-hidden-states with pp_size != 1. Capture with "
        f"pipeline size 1: drop --pp-size from engine.extra_args (e.g. TP only on the same {gpus} GPUs, model.tp "
        f"{gpus}), the same engine build otherwise. The capture spec records engine.extra_args (and model.tp): a "
        "draft captured so and served with --pp-size differs in extra_args.pp_size, which "
        "serve.allow_engine_differences cannot name (only flags that cannot change hidden states; tp it can): "
        "serve it with the capture's options, or set serve.allow_provenance_mismatch=true")


def hidden_state_options(cfg: Config) -> dict:
    """The launch options that change the target's hidden states, as the capture spec records them;
    ``extra_args`` only when ``engine.extra_args`` set any (:func:`extra_options`)."""
    e, m = cfg.engine, cfg.model
    extra = extra_options(cfg.engine)
    return {"quantization": m.quantization, "dtype": target_dtype(m.path, m.dtype),
            "attention_backend": attention_backend(cfg), "moe_runner_backend": e.moe_runner_backend,
            "kv_cache_dtype": e.kv_cache_dtype, "tp": m.tp, "dp": m.dp, "ep": m.ep} | ({"extra_args": extra} if extra else {})


def base_args(cfg: Config) -> list[str]:
    e, m = cfg.engine, cfg.model
    check_backends(cfg.engine)
    attention_dp_size(cfg)  # refuses a DP-attention flag that would do nothing or stop SGLang
    args = ["--model-path", str(m.path), "--host", e.host, "--port", str(e.port), "--tp", str(m.tp),
            "--dtype", m.dtype, "--device", e.device]
    if m.quantization:
        args += ["--quantization", m.quantization]
    if m.trust_remote_code:
        args.append("--trust-remote-code")
    if e.device == "cpu":
        args += ["--disable-cuda-graph", "--sleep-on-idle"]
        if e.max_total_tokens is None:
            raise ValueError("engine.max_total_tokens: required on CPU (SGLang would take most of the RAM)")
    for flag, value in (("--attention-backend", attention_backend(cfg)),
                        ("--dp-size", m.dp if m.dp > 1 else None),
                        ("--ep-size", m.ep if m.ep > 1 else None),
                        ("--moe-runner-backend", e.moe_runner_backend),
                        ("--kv-cache-dtype", e.kv_cache_dtype),
                        ("--mem-fraction-static", e.mem_fraction_static),
                        ("--max-total-tokens", e.max_total_tokens),
                        ("--chunked-prefill-size", e.chunked_prefill_size)):
        if value is not None:
            args += [flag, str(value)]
    return args + list(e.extra_args)


def launch_args(cfg: Config, mode: Mode, layer_ids: list[int] | None = None, warmup: bool = True) -> list[str]:
    """``layer_ids``: the aux layers to capture (SGLang's convention), for ``capture`` only. ``warmup=False``:
    SGLang sends no warm-up request of its own before it reports healthy, for a caller that warms the server
    up itself (``eaglebox bench``); a capture server never warms up (its first request would be captured)."""
    args = base_args(cfg)
    if not warmup and mode != "capture":
        args.append("--skip-server-warmup")
    if mode == "capture":
        if layer_ids is None:
            raise ValueError("capture mode needs the layer ids to capture")
        check_capture_pipeline(cfg, layer_ids)  # refuses --pp-size > 1: SGLang delivers no features there
        args += ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                 "--return-aux-hidden-state-layer-ids", *map(str, layer_ids),
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


def draft_layer_inputs(draft_path: Path) -> list[int] | None:
    """The layers whose inputs the draft's features came from (its ``eaglebox`` block); None for a
    draft eaglebox did not train (served only with ``serve.allow_provenance_mismatch``)."""
    try:
        block = json.loads((Path(draft_path) / "config.json").read_text()).get("eaglebox") or {}
    except (OSError, json.JSONDecodeError):
        return None
    return block.get("captured_layer_inputs")


def launch_env(cfg: Config, mode: Mode, capture_dir: Path | None = None,
               sample_header: dict | None = None, transport_env: dict | None = None) -> dict[str, str]:
    """``capture``: the server records ``sample_header`` (the capture spec's) in every sample, so
    the client's checks see every field of the spec; ``transport_env`` sends the samples elsewhere than
    ``capture_dir`` (:func:`eaglebox.shards.transport.server_env`: the Mooncake store). ``speculative``: the server checks, once SGLang
    has configured the target for the draft, that it hooks the layers the draft was trained on
    (``eaglebox.capture.serve_check``)."""
    env = dict(cfg.engine.env)
    if cfg.engine.device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        # torch.compile'd SGLang helpers (MoE routing at a DeepSeek server's start, the repetition penalty at a first
        # penalised answer) cost ~20 s of inductor per CPU server, same outputs eager: as the CPU image (issue 30).
        if "TORCHDYNAMO_DISABLE" not in {**os.environ, **env}:
            env["TORCHDYNAMO_DISABLE"] = "1"
        if attention_backend(cfg) == "triton":  # Triton's kernels run on CPU only through its interpreter
            env.setdefault("TRITON_INTERPRET", "1")
    if mode == "capture":
        if capture_dir is None:
            raise ValueError("capture mode needs a capture directory")
        env["EAGLEBOX_CAPTURE_DIR"] = str(capture_dir)
        if sample_header is not None:
            env["EAGLEBOX_CAPTURE_HEADER"] = json.dumps(sample_header, sort_keys=True)
        env["EAGLEBOX_CAPTURE_BUFFER_BYTES"] = str(cfg.extract.writer_buffer_mb << 20)
        env["EAGLEBOX_CAPTURE_WRITERS"] = str(cfg.extract.capture_writers)
        # On CPU the forward runs on the cores the writers would take: they yield to it (nice 19).
        env.setdefault("EAGLEBOX_CAPTURE_NICE_WRITERS", "1" if cfg.engine.device == "cpu" else "0")
        env.update(transport_env or {})
    if mode == "speculative" and (expected := draft_layer_inputs(cfg.serve.draft_path)) is not None:
        env["EAGLEBOX_EXPECT_LAYER_INPUTS"] = json.dumps(expected)
    return env | no_crash_dump_waits({**os.environ, **env})


def no_crash_dump_waits(env: dict[str, str]) -> dict[str, str]:
    """SGLang 0.5.23 meets a child's exit (a failed scheduler, a capture writer's ``stop_server``, and every stop:
    SIGTERM to the group ends the scheduler first) with crash diagnostics: it sleeps 5 s, py-spy dumps the
    schedulers still alive, then waits 60 s for their CUDA core dumps. Where no dump can be made (no py-spy on
    the server's PATH; CUDA_ENABLE_USER_TRIGGERED_COREDUMP not 1, as in every CPU run) that is only waiting:
    each stop took 5.6 s, a capture that filled its disk 65 s to end. ``env``: the server's whole environment;
    a setting of its own is kept."""
    off = {}
    if shutil.which("py-spy", path=env.get("PATH")) is None:
        off["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] = "0"
    if env.get("CUDA_ENABLE_USER_TRIGGERED_COREDUMP") != "1":
        off["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] = "0"
    return {k: v for k, v in off.items() if k not in env}


def server_for(cfg: Config, mode: Mode, log_path: Path, capture_dir: Path | None = None,
               layer_ids: list[int] | None = None, sample_header: dict | None = None,
               transport_env: dict | None = None, warmup: bool = True):
    """An (unstarted) :class:`SGLangServer` for ``cfg`` in ``mode``; ``capture`` writes ``layer_ids`` to
    ``capture_dir`` (or through ``transport_env``'s transport), each sample with ``sample_header``
    (:func:`launch_env`); ``warmup``: see :func:`launch_args`."""
    from eaglebox.engine.server import SGLangServer

    return SGLangServer(launch_args(cfg, mode, layer_ids, warmup), env=launch_env(cfg, mode, capture_dir, sample_header, transport_env),
                        log_path=log_path, host=cfg.engine.host, port=cfg.engine.port,
                        startup_timeout_s=cfg.engine.startup_timeout_s,
                        writes_to=[capture_dir] if capture_dir is not None else [])
