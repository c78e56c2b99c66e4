"""eaglebox_dev.int4: the tiny DeepSeek-V3 target in Kimi-K2.5's INT4 format, checked by compressed-tensors
itself (SGLang's dependency), and its dequantized bf16 twin."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from eaglebox_dev import int4, tiny_mla

KIMI_K25_PUBLISHED = (
    '{"config_groups": {"group_0": {"input_activations": null, "output_activations": null, "targets": ["Linear"], '
    '"weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4, '
    '"observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}}, '
    '"format": "pack-quantized", "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", '
    '"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"], '
    '"kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"}')
"""``text_config.quantization_config`` of huggingface.co/moonshotai/Kimi-K2.5 (main), as published."""


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d = tmp_path_factory.mktemp("int4")
    summary = int4.quantize_target(tiny_mla.SHIPPED, d / "int4", d / "bf16", log=lambda *_: None)
    return d / "int4", d / "bf16", summary


def test_pack_round_trips_and_is_compressed_tensors_bit_layout():
    from compressed_tensors.compressors.pack_quantized import pack_to_int32, unpack_from_int32

    q = torch.randint(-8, 8, (64, 128), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    packed = int4.pack(q)
    assert packed.dtype == torch.int32 and packed.shape == (64, 16)
    assert torch.equal(int4.unpack(packed, 128), q)
    assert torch.equal(packed, pack_to_int32(q, 4))  # the format's own packer, word for word
    assert torch.equal(unpack_from_int32(packed, 4, torch.Size((64, 128))), q)
    assert int4.pack(torch.tensor([[-8, 7, 0, 1, 2, 3, 4, 5]], dtype=torch.int8)).item() == int(
        "DCBA98F0", 16) - (1 << 32)  # value j in bits 4j..4j+3, stored +8: -8 -> 0x0 lowest, 7 -> 0xF


def test_quantize_is_symmetric_minmax_on_the_stored_scale():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w[3, :32] = 0  # an all-zero group: scale 0, values 0, nothing divided by zero
    q, scale = int4.quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (8, 2)
    assert int(q.min()) == -8 and int(q.max()) == 7  # the whole int4 range is used
    assert scale[3, 0] == 0 and not q[3, :32].any()
    deq = int4.dequantize(q, scale).float()
    step = scale.float().repeat_interleave(32, 1)
    inside = ((w.float() / step.clamp_min(1e-30)) <= 7.5) & ((w.float() / step.clamp_min(1e-30)) >= -8.5)
    err = (deq - w.float()).abs()
    assert bool((err <= step * 0.5 + deq.abs() * 2**-8 + 1e-7)[inside].all())  # the nearest grid point, in bf16
    assert bool((q[~inside].abs() >= 7).all())  # beyond the grid (the scale rounded down to bf16): clipped to its end
    assert float(err.max()) < float(step.max())
    with pytest.raises(ValueError, match="multiple of the group size"):
        int4.quantize(torch.zeros(2, 40, dtype=torch.bfloat16))


def test_config_block_is_kimi_k25s_and_the_rest_of_the_config_is_kept(quantized):
    out, bf16, _ = quantized
    src = json.loads((tiny_mla.SHIPPED / "config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    published = json.loads(KIMI_K25_PUBLISHED)
    assert cfg["quantization_config"] == published and list(cfg["quantization_config"]) == list(published)
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src
    assert json.loads((bf16 / "config.json").read_text()) == src  # the twin has no quantization_config
    assert (out / "tokenization_tiny_kimi.py").exists() and not (out / "eaglebox-tiny.json").exists()


def test_compressed_tensors_decompresses_the_file_to_the_dequantized_twin(quantized):
    """Its own target and ignore matching quantizes the routed experts and nothing else; what it
    decompresses equals the dequantized model bit for bit."""
    out, bf16, summary = quantized
    got, modules = int4.decompress_with_compressed_tensors(out)
    twin = load_file(bf16 / "model.safetensors")
    routed = {k for k in twin if int4.ROUTED_EXPERT.match(k)}
    assert len(routed) == summary["quantized_tensors"] == 4 * 8 * 3  # 4 MoE layers, 8 experts, gate/up/down
    assert {f"{m}.weight" for m in modules} == set(got) == routed
    assert all(torch.equal(got[k], twin[k]) for k in routed)


def test_ignored_modules_are_untouched_and_experts_are_packed(quantized):
    out, bf16, summary = quantized
    src = load_file(tiny_mla.SHIPPED / "model.safetensors")
    packed, twin = load_file(out / "model.safetensors"), load_file(bf16 / "model.safetensors")
    for name, t in src.items():
        if int4.ROUTED_EXPERT.match(name):
            base = name[: -len(".weight")]
            assert name not in packed and packed[f"{base}.weight_packed"].dtype == torch.int32
            assert packed[f"{base}.weight_shape"].tolist() == list(t.shape)
            assert not torch.equal(twin[name], t)  # rounded to the int4 grid, so not a copy
        else:  # attention, shared experts, the dense layer, router, norms, embedding, lm_head
            assert torch.equal(packed[name], t) and torch.equal(twin[name], t), name
    assert set(twin) == set(src)
    assert 0.02 < summary["weight_rel_rms_error"] < 0.15


def test_refuses_what_is_not_a_bf16_moe_target(tmp_path):
    from safetensors.torch import save_file

    src = tmp_path / "dense"
    src.mkdir()
    (src / "config.json").write_text("{}")
    save_file({"model.layers.0.mlp.gate_proj.weight": torch.zeros(64, 64, dtype=torch.bfloat16)},
              src / "model.safetensors")
    with pytest.raises(ValueError, match="no routed-expert weights"):
        int4.quantize_target(src, tmp_path / "out", log=lambda *_: None)
    save_file({"model.layers.1.mlp.experts.0.up_proj.weight": torch.zeros(64, 64)}, src / "model.safetensors")
    with pytest.raises(ValueError, match="reads a bf16 target"):
        int4.quantize_target(src, tmp_path / "out", log=lambda *_: None)


SGLANG_INT4_MOE_KERNEL = """import json, sys

import torch
import triton
import triton.language as tl
from safetensors.torch import load_file
from sglang.kernels.ops.moe.fused_moe_triton_kernels import fused_moe_kernel_gptq_awq
from eaglebox_dev import int4

packed = load_file(sys.argv[1] + "/model.safetensors")
E, T, BM = 8, 24, 16
p = "model.layers.1.mlp.experts.{}.{}_proj.weight_{}"
torch.manual_seed(0)
expert_of = [i % E for i in range(T)]
out = {}
for names, K in ((("gate", "up"), 128), (("down",), 64)):
    w = torch.stack([torch.cat([packed[p.format(e, n, "packed")] for n in names]) for e in range(E)])
    s = torch.stack([torch.cat([packed[p.format(e, n, "scale")] for n in names]) for e in range(E)]).half()
    N = w.shape[1]
    x = torch.randn(T, K).half()
    # the reference: q * scale from eaglebox_dev.int4's unpack, rounded to fp16 as the kernel's compute type
    deq = torch.stack([(int4.unpack(w[e], K).float().reshape(N, K // 32, 32) * s[e].float()[..., None]).reshape(N, K)
                       for e in range(E)]).half()
    ref = torch.stack([x[i].float() @ deq[expert_of[i]].float().T for i in range(T)])
    for layout in ("file", "nibbles_swapped"):
        u8 = w.contiguous().view(torch.uint8)  # [E, N, K/2]: CompressedTensorsWNA16TritonMoE's layout after loading
        if layout == "nibbles_swapped":
            u8 = ((u8 << 4) | (u8 >> 4)).contiguous()
        ids, experts = [], []
        for e in range(E):
            rows = [i for i in range(T) if expert_of[i] == e]
            ids += rows + [T] * (BM - len(rows))
            experts.append(e)
        ids, experts = torch.tensor(ids, dtype=torch.int32), torch.tensor(experts, dtype=torch.int32)
        C = torch.zeros(T, N, dtype=torch.float16)
        fused_moe_kernel_gptq_awq[(len(experts) * triton.cdiv(N, 32),)](
            x, u8, C, s, None, None, ids, experts, torch.tensor([len(ids)], dtype=torch.int32), N, K, len(ids), T,
            x.stride(0), x.stride(1), u8.stride(0), u8.stride(2), u8.stride(1), C.stride(0), C.stride(1),
            s.stride(0), s.stride(2), s.stride(1), 0, 0, 0, group_size=32, MUL_ROUTED_WEIGHT=False, top_k=1,
            compute_type=tl.float16, has_zp=False, use_int4_w4a16=True, use_int8_w8a16=False, even_Ks=True,
            BLOCK_SIZE_M=BM, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1)
        out[f"{'w13' if K == 128 else 'w2'}_{layout}"] = float((C.float() - ref).norm() / ref.norm())
print(json.dumps(out))
"""
"""One MoE layer of the INT4 file through SGLang's own W4A16 kernel (``fused_moe_kernel_gptq_awq``, what
``--moe-runner-backend triton`` runs), its weights laid out as SGLang 0.5.23 leaves them: ``FusedMoE``'s loader
transposes each expert's tensors into [K/8, N] slots, gate then up (``fused_moe_triton/layer.py:1355-1366``),
and ``CompressedTensorsWNA16TritonMoE`` transposes back and views the words as bytes ([E, N, K/2] uint8,
``compressed_tensors_wNa16_moe.py:515``). Each token goes to one expert; the relative error against
``x @ (q * scale)^T``, for the file and for a copy with each byte's nibbles swapped."""


def test_sglang_int4_moe_kernel_reads_the_file_as_q_times_scale(quantized):
    """In float16: under Triton's interpreter the same call in bfloat16 gives ~1e11 for outputs of ~1 (likely
    the wrong CPU output of benchmarks/results/int4-cpu-probe.md), as the interpreter's bf16 MLA does
    (eaglebox refuses that); on a GPU the kernel runs in bf16. The swapped copy shows the check tells
    layouts apart."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_USE_CPU_ENGINE": "1"}
    r = subprocess.run([sys.executable, "-c", SGLANG_INT4_MOE_KERNEL, str(quantized[0])], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    err = json.loads(r.stdout.strip().splitlines()[-1])
    assert err["w13_file"] < 1e-3 and err["w2_file"] < 1e-3, err  # fp16 rounding of the outputs
    assert err["w13_nibbles_swapped"] > 0.5 and err["w2_nibbles_swapped"] > 0.5, err
