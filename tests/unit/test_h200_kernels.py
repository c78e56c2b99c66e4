"""tools/h200: the torch stand-in for sgl_kernel and the EAGLE tree-kernel fallback, on CPU.

The stand-in's Llama-forward functions are compared with SGLang 0.5.23's own native implementations
(``forward_native`` of RMSNorm, SiluAndMul, GeluAndMul, RotaryEmbedding); the tree fallback of
``h200_patches.tree_kernels`` (SGLang's Triton kernels, run here by Triton's interpreter) with eaglebox's
reference tree build and greedy verification (``eaglebox_dev.cpu_kernels``). Each in a subprocess: the
stand-in registers ``sgl_kernel.*`` modules and TRITON_INTERPRET must be set before Triton is imported.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tools" / "h200"

STAND_IN = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("h200_sgl_kernel", sys.argv[1])
k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
from sglang.srt.layers.activation import GeluAndMul, SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

torch.manual_seed(0)
out = {}
def close(name, got, want, tol):
    out[name] = float((got.float() - want.float()).abs().max()) <= tol * float(want.float().abs().max())

x = torch.randn(7, 256, dtype=torch.bfloat16); r = torch.randn(7, 256, dtype=torch.bfloat16)
norm = RMSNorm(256, eps=1e-5); norm.weight.data = torch.rand(256) + 0.5
close("rmsnorm", k.rmsnorm(x, norm.weight.data.to(torch.bfloat16), 1e-5),
      norm.to(torch.bfloat16).forward_native(x), 2e-2)
want_x, want_r = norm.forward_native(x.clone(), r.clone())
xi, ri = x.clone(), r.clone()
k.fused_add_rmsnorm(xi, ri, norm.weight.data, 1e-5)
close("fused_add_rmsnorm.residual", ri, want_r, 1e-2)
close("fused_add_rmsnorm.out", xi, want_x, 2e-2)
g = torch.randn(5, 2 * 96, dtype=torch.bfloat16)
close("silu_and_mul", k.silu_and_mul(g), SiluAndMul().forward_native(g), 2e-2)
close("gelu_and_mul", k.gelu_and_mul(g), GeluAndMul().forward_native(g), 2e-2)
for neox in (True, False):
    rope = RotaryEmbedding(64, 64, 512, 10000, neox, torch.float32)
    pos = torch.randint(0, 512, (9,))
    q, kk = torch.randn(9, 4 * 64), torch.randn(9, 2 * 64)
    wq, wk = rope.forward_native(pos, q.clone(), kk.clone())
    gq, gk = q.clone(), kk.clone()
    k.rotary_embedding(pos, gq, gk, 64, rope.cos_sin_cache, neox)
    close(f"rotary_embedding.neox={neox}", torch.cat([gq, gk], 1), torch.cat([wq, wk], 1), 1e-5)
print(json.dumps(out))
"""


def test_stand_in_matches_sglang_native_layers(tmp_path):
    names = tmp_path / "names.json"  # the stand-in reads the real package's export list; these suffice here
    names.write_text(json.dumps({"sgl_kernel": ["rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "gelu_and_mul",
                                                "rotary_embedding"]}))
    env = {**os.environ, "EAGLEBOX_SGLK_NAMES": str(names)}
    r = subprocess.run([sys.executable, "-c", STAND_IN, str(H200 / "sgl_kernel" / "__init__.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got and all(got.values()), got


TREE = r"""
import importlib.util, json, sys, types, torch
spec = importlib.util.spec_from_file_location("h200_patches", sys.argv[1])  # not tools/h200 on the path: its
h200_patches = importlib.util.module_from_spec(spec); spec.loader.exec_module(h200_patches)  # sgl_kernel is there
from eaglebox_dev import cpu_kernels as ref

def broken():
    raise RuntimeError("nvcc: not found")
jit = types.SimpleNamespace(_jit_tree_module=broken, build_tree_kernel_efficient=None, verify_tree_greedy=None)
h200_patches.tree_kernels(jit)  # what the hook does to sglang.kernels.ops.speculative.tree
torch.manual_seed(0)
same = []
for case in range(6):
    bs, topk, depth = 3, [1, 2, 4][case % 3], 3
    n = [4, 6, 8][case % 3]
    seq = torch.tensor([5, 9, 2])
    plen = topk * (depth - 1) + 1
    parent = torch.randint(0, topk * plen, (bs, plen))
    sel = torch.stack([torch.randperm(topk * plen)[: n - 1] for _ in range(bs)])
    cands, target = torch.randint(0, 3, (bs, n)), torch.randint(0, 3, (bs, n))
    outs = []
    for impl in ("fallback", "reference"):
        mask = torch.ones(int(n * n * bs + seq.sum() * n), dtype=torch.bool)
        pos = torch.zeros(bs * n, dtype=torch.int64)
        ri, rn, rs = (torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3))
        args = (parent, sel, seq, mask, pos, ri, rn, rs, topk, depth, n, 0)
        (jit.build_tree_kernel_efficient if impl == "fallback" else ref.build_tree_kernel_efficient_cpu)(*args)
        pr = torch.full((bs * n,), -1, dtype=torch.int64)
        ai = torch.full((bs, depth + 1), -1, dtype=torch.int64)
        an = torch.zeros(bs, dtype=torch.int64)
        kw = dict(predicts=pr, accept_index=ai, accept_token_num=an, candidates=cands, retrive_index=ri,
                  retrive_next_token=rn, retrive_next_sibling=rs, target_predict=target)
        (jit.verify_tree_greedy if impl == "fallback" else ref.verify_tree_greedy_cpu)(**kw)
        outs.append([t.tolist() for t in (mask, pos, ri, rn, rs, pr, ai, an)])
    same.append(outs[0] == outs[1])
print(json.dumps(same))
"""


def test_tree_fallback_is_sglang_triton_and_matches_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1", "EAGLEBOX_H200_TREE_KERNELS": "auto"}
    r = subprocess.run([sys.executable, "-c", TREE, str(H200 / "h200_patches.py")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True] * 6
    assert "JIT tree kernels did not build (RuntimeError: nvcc: not found)" in r.stderr
    assert "EAGLE tree kernels: SGLang Triton" in r.stderr


MOE = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("h200_sgl_kernel", sys.argv[1])
k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
from sglang.kernels.ops.moe.moe_align_small_numel import moe_align_small_numel

torch.manual_seed(0)
out = {}
for tokens, topk, experts, block in ((1, 8, 16, 16), (5, 8, 16, 16), (7, 2, 8, 4), (3, 4, 64, 16)):
    ids = torch.stack([torch.randperm(experts)[:topk] for _ in range(tokens)]).int()
    ids[0, -1] = -1  # an expert filtered out (EP): bucket 0, expert id -1
    numel = ids.numel()
    cap = ((numel + (experts + 2) * (block - 1)) + 3) // 4 * 4
    blocks = (cap + block - 1) // block
    got = [torch.full((cap,), -7, dtype=torch.int32), torch.full((blocks,), -7, dtype=torch.int32),
           torch.zeros(1, dtype=torch.int32)]
    k.moe_align_block_size(ids, experts + 1, block, *got, torch.zeros(experts + 3, dtype=torch.int32), True)
    want = [torch.full((cap,), -7, dtype=torch.int32), torch.full((blocks,), -7, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32)]
    moe_align_small_numel(ids, experts + 1, block, *want)
    total = int(want[2])
    out[f"{tokens}x{topk}of{experts}"] = (int(got[2]) == total and torch.equal(got[0][:total], want[0][:total])
                                         and torch.equal(got[1][: total // block], want[1][: total // block]))
x = torch.randn(6, 8, 96, dtype=torch.bfloat16)
o = torch.empty(6, 96, dtype=torch.bfloat16)
k.moe_sum_reduce(x, o, 2.827)
out["moe_sum_reduce"] = bool(torch.allclose(o.float(), x.float().sum(1) * 2.827, rtol=1e-2, atol=1e-2))
print(json.dumps(out))
"""


def test_stand_in_moe_align_matches_sglang_triton(tmp_path):
    """The two MoE names a DeepSeek-V3 layer calls on CUDA, against SGLang's own Triton statement of the
    align contract (run by Triton's interpreter)."""
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"sgl_kernel": ["moe_align_block_size", "moe_sum_reduce"]}))
    env = {**os.environ, "EAGLEBOX_SGLK_NAMES": str(names), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", MOE, str(H200 / "sgl_kernel" / "__init__.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == 5 and all(got.values()), got
