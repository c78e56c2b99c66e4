"""The GPU presets cannot run here: they are checked through the SGLang launch commands they produce,
against SGLang 0.5.23's own lists of valid backends."""

import json
import os

import pytest

from eaglebox.config import load_config
from eaglebox.engine.launch import launch_args, launch_env, no_crash_dump_waits
from eaglebox.errors import EagleboxError
from eaglebox.target.layers import sglang_layer_ids

KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {
    "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
                "vocab_size": 128256}


def fake_model(tmp_path, cfg):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def flag(args, name):
    i = args.index(name)
    return args[i + 1]


def test_kimi_preset_names_sm120_backends_and_sglang_layer_ids(tmp_path):
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        DRAFT_ATTENTION_BACKEND_CHOICES,
        MOE_RUNNER_BACKEND_CHOICES,
    )

    cfg = load_config("configs/kimi-k2.5-8x-rtxpro6000.yaml", [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}"])
    cap = launch_args(cfg, "capture", sglang_layer_ids(cfg))
    assert flag(cap, "--tp") == "8"
    assert flag(cap, "--attention-backend") == "triton" and "triton" in ATTENTION_BACKEND_CHOICES
    assert flag(cap, "--moe-runner-backend") == "marlin" and "marlin" in MOE_RUNNER_BACKEND_CHOICES
    i = cap.index("--return-aux-hidden-state-layer-ids")
    assert cap[i + 1 : i + 4] == ["2", "30", "58"]  # inputs of 2, 30, 58: deepseek_v2 takes them as given
    assert "--trust-remote-code" in cap  # model.trust_remote_code (Kimi's tokenizer is code)
    assert "--disable-radix-cache" in cap and "--enable-return-aux-hidden-states" in cap
    spec = launch_args(cfg, "speculative")
    assert flag(spec, "--speculative-algorithm") == "EAGLE3"
    assert flag(spec, "--speculative-draft-model-quantization") == "unquant"
    assert flag(spec, "--speculative-draft-attention-backend") in DRAFT_ATTENTION_BACKEND_CHOICES
    assert (flag(spec, "--speculative-num-steps"), flag(spec, "--speculative-eagle-topk"),
            flag(spec, "--speculative-num-draft-tokens")) == ("3", "1", "4")
    # the capture and the serve launch share every engine flag (train as you infer)
    base = cap[: cap.index("--enable-return-aux-hidden-states")]
    assert spec[: len(base)] == base


def test_llama_preset_converts_reference_layer_ids_once(tmp_path):
    cfg = load_config("configs/llama-3.1-8b-1gpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}"])
    cap = launch_args(cfg, "capture", sglang_layer_ids(cfg))
    i = cap.index("--return-aux-hidden-state-layer-ids")
    assert cap[i + 1 : i + 4] == ["1", "15", "28"]  # inputs of 2, 16, 29


def test_cpu_engine_requires_a_token_budget(tmp_path):
    cfg = load_config("configs/tiny-cpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}",
                                                "engine.max_total_tokens=null"])
    with pytest.raises(ValueError, match="engine.max_total_tokens: required on CPU"):
        launch_args(cfg, "plain")


DEEPSEEK_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 6,
                   "hidden_size": 64, "num_attention_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
                   "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "head_dim": 8,
                   "intermediate_size": 128, "vocab_size": 256, "torch_dtype": "bfloat16"}
"""DeepSeek-V3's shape as transformers v5 writes it (``head_dim`` is ``qk_rope_head_dim``); no weights."""


def test_cpu_attention_backend_follows_the_architecture(tmp_path):
    llama = load_config("configs/tiny-cpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}"])
    assert flag(launch_args(llama, "plain"), "--attention-backend") == "torch_native"
    assert "TRITON_INTERPRET" not in launch_env(llama, "plain")
    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps(DEEPSEEK_CONFIG))
    cfg = load_config("configs/tiny-cpu.yaml", [f"model.path={mla}", "model.dtype=float32",
                                                "capture.layer_ids=[1, 2, 3]"])
    assert flag(launch_args(cfg, "capture", [2, 3, 4]), "--attention-backend") == "triton"
    assert launch_env(cfg, "capture", tmp_path)["TRITON_INTERPRET"] == "1"
    with pytest.raises(EagleboxError, match="model.dtype: bfloat16 with the triton attention backend on CPU .*"
                                            "set model.dtype=float32"):
        launch_args(load_config("configs/tiny-cpu.yaml", [f"model.path={mla}"]), "plain")


def test_torch_native_with_an_mla_target_is_refused_before_the_server_starts(tmp_path, monkeypatch):
    import eaglebox.extract.run as extract_run
    import eaglebox.stages.extract as stage

    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps(DEEPSEEK_CONFIG))
    monkeypatch.setattr(extract_run, "server_for", lambda *a, **k: pytest.fail("a server was built"))
    cfg = load_config("configs/tiny-cpu.yaml", [f"model.path={mla}", "model.dtype=float32", "capture.layer_ids=[1, 2, 3]",
                                                "engine.attention_backend=torch_native",
                                                f"extract.output_dir={tmp_path / 'shards'}"])
    with pytest.raises(EagleboxError, match=r"engine.attention_backend: torch_native computes DeepseekV3ForCausalLM's "
                                            r"MLA attention wrongly on CPU .* set it to triton"):
        stage.run(cfg)
    assert not (tmp_path / "shards").exists()


def test_engine_extra_args_may_not_carry_flags_with_keys(tmp_path):
    from eaglebox.config import ConfigError

    with pytest.raises(ConfigError, match=r"engine.extra_args: .*--kv-cache-dtype has its own key, "
                                          r"engine.kv_cache_dtype"):
        load_config("configs/tiny-cpu.yaml", ['engine.extra_args=["--kv-cache-dtype=fp8_e4m3"]'])


def test_capture_writers_are_niced_on_cpu_only_and_counted_by_the_config(tmp_path):
    model = fake_model(tmp_path, LLAMA_CONFIG)
    cpu = load_config("configs/tiny-cpu.yaml", [f"model.path={model}"])
    assert launch_env(cpu, "capture", tmp_path)["EAGLEBOX_CAPTURE_NICE_WRITERS"] == "1"
    gpu = load_config("configs/tiny-cpu.yaml", [f"model.path={model}", "engine.device=cuda"])
    assert launch_env(gpu, "capture", tmp_path)["EAGLEBOX_CAPTURE_NICE_WRITERS"] == "0"
    assert launch_env(gpu, "capture", tmp_path)["EAGLEBOX_CAPTURE_WRITERS"] == "8"
    four = load_config("configs/tiny-cpu.yaml", [f"model.path={model}", "extract.capture_writers=4"])
    assert launch_env(four, "capture", tmp_path)["EAGLEBOX_CAPTURE_WRITERS"] == "4"


@pytest.mark.parametrize("dp_attention", [["model.dp=8", 'engine.extra_args=["--enable-dp-attention"]'],
                                          ['engine.extra_args=["--attn-dp-size", "8"]']])
def test_kimi_preset_with_dp_attention(tmp_path, dp_attention):
    """Kimi's serving layout, TP 8 with 8 attention-DP groups, in either of SGLang 0.5.23's spellings:
    resolved by SGLang's own rule, and carried by the capture and the serve launch alike."""
    from eaglebox.engine.launch import attention_dp_size

    cfg = load_config("configs/kimi-k2.5-8x-rtxpro6000.yaml",
                      [f"model.path={fake_model(tmp_path, KIMI_CONFIG)}", *dp_attention])
    assert attention_dp_size(cfg) == 8
    cap, spec = launch_args(cfg, "capture", sglang_layer_ids(cfg)), launch_args(cfg, "speculative")
    base = cap[: cap.index("--enable-return-aux-hidden-states")]
    assert spec[: len(base)] == base and flag(spec, "--speculative-algorithm") == "EAGLE3"
    assert ("--enable-dp-attention" in base) == ("model.dp=8" in dp_attention)


def test_dp_attention_that_would_do_nothing_or_stop_sglang_is_refused_before_a_server_starts(tmp_path, monkeypatch):
    """One GPU (model.tp 1, model.dp 1): SGLang makes --enable-dp-attention one attention group, i.e. nothing;
    a number of groups that does not divide model.tp stops every scheduler process. Both are refused by
    `eaglebox serve` before SGLang is started."""
    import eaglebox.stages.serve as serve

    monkeypatch.setattr(serve.os, "execvpe", lambda *a: pytest.fail("a server was started"))
    one_gpu = load_config("configs/tiny-cpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}",
                                                    "serve.draft_path=null",
                                                    'engine.extra_args=["--enable-dp-attention"]'])
    with pytest.raises(EagleboxError, match=r"--enable-dp-attention with model.dp 1 does nothing: SGLang 0.5.23 "
                                            r"makes it --attn-dp-size <model.dp>"):
        serve.run(one_gpu)
    (tmp_path / "kimi").mkdir()
    kimi = load_config("configs/kimi-k2.5-8x-rtxpro6000.yaml",
                       [f"model.path={fake_model(tmp_path / 'kimi', KIMI_CONFIG)}", "serve.draft_path=null",
                        "model.dp=3", 'engine.extra_args=["--enable-dp-attention"]'])
    with pytest.raises(EagleboxError, match=r"DP attention with 3 attention groups needs model.tp divisible by 3"):
        serve.run(kimi)


def test_servers_wait_for_no_crash_dump_that_cannot_be_made(tmp_path):
    """SGLang's crash diagnostics (a 5 s sleep before py-spy, 60 s for CUDA core dumps) are switched off where
    they cannot run; where they can, or where the environment sets them, they are left alone. The stop they
    cost is checked on a real server in tests/integration/test_sglang_server.py."""
    bare = {"PATH": str(tmp_path)}
    assert no_crash_dump_waits(bare) == {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    assert no_crash_dump_waits({"PATH": str(tmp_path), "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1"}) == {}
    assert no_crash_dump_waits({**bare, "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "1"}) == {
        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
    cfg = load_config("configs/tiny-cpu.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}"])
    assert launch_env(cfg, "plain")["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "0"  # no CUDA here


def test_servers_skip_sglangs_warm_up_only_where_the_caller_warms_them_up(tmp_path):
    """``eaglebox bench`` warms up every server it measures, so the servers it starts send no warm-up request of
    SGLang's own (``warmup=False``); ``eaglebox serve`` and every other plain or speculative start keep it; a
    capture server never has one. The skipped request is checked on real servers in
    tests/integration/test_export_and_gate.py (the served speculation test reads its bench's server logs)."""
    cfg = load_config("configs/tiny-cpu-served.yaml", [f"model.path={fake_model(tmp_path, LLAMA_CONFIG)}"])
    for mode in ("plain", "speculative"):
        assert "--skip-server-warmup" not in launch_args(cfg, mode)
        assert launch_args(cfg, mode, warmup=False).count("--skip-server-warmup") == 1
    for warmup in (True, False):
        assert launch_args(cfg, "capture", [0, 1, 2], warmup=warmup).count("--skip-server-warmup") == 1


def test_cpu_servers_run_torch_compiled_code_eagerly_unless_told_otherwise(tmp_path, monkeypatch):
    """A CPU server gets TORCHDYNAMO_DISABLE=1: SGLang's torch.compile'd helpers (MoE routing in a DeepSeek
    server's start, the repetition penalty at a first penalised answer) cost ~20 s of inductor per server, for
    the same tokens and features (benchmarks/results/suite-speed-cpu-2026-12-07-host-dynamo.txt). Never on
    CUDA; a setting in the user's environment or in engine.env is kept; the process that starts the server
    (tests/unit/test_train_parts.py compiles in it) is left alone."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    model = fake_model(tmp_path, LLAMA_CONFIG)
    cpu = load_config("configs/tiny-cpu.yaml", [f"model.path={model}"])
    for mode, capture_dir in (("plain", None), ("capture", tmp_path)):
        assert launch_env(cpu, mode, capture_dir)["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in os.environ
    gpu = load_config("configs/tiny-cpu.yaml", [f"model.path={model}", "engine.device=cuda"])
    for mode, capture_dir in (("plain", None), ("capture", tmp_path)):
        assert "TORCHDYNAMO_DISABLE" not in launch_env(gpu, mode, capture_dir)
    told = load_config("configs/tiny-cpu.yaml", [f"model.path={model}", 'engine.env={"TORCHDYNAMO_DISABLE": "0"}'])
    assert launch_env(told, "plain")["TORCHDYNAMO_DISABLE"] == "0"
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    assert "TORCHDYNAMO_DISABLE" not in launch_env(cpu, "plain")  # the server inherits the user's 0
