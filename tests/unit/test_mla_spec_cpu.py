"""The CPU correction served speculation needs for an MLA target (``eaglebox_dev.cpu_patches``): the
target-verify attention in torch, against SGLang 0.5.23's own extend kernel run by Triton's interpreter
(in a subprocess, since TRITON_INTERPRET must be set before import)."""

import json
import os
import subprocess
import sys

MLA_VERIFY = r"""
import json, torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from eaglebox_dev.cpu_patches import mla_verify_attention
torch.manual_seed(0)
worst = 0.0
# (heads, kv heads, Lk, Lv, prefix lengths, draft tokens): the tiny target's absorbed MLA (one latent
# head, 256 + 32 rope), Kimi's widths (512 + 64), and a grouped-KV case
for H, KH, lk, lv, prefixes, n in ((4, 1, 288, 256, [7, 30], 4), (2, 1, 576, 512, [3, 17], 4),
                                   (4, 2, 32, 32, [5, 12, 3], 3)):
    B = len(prefixes)
    qo = torch.tensor([0] + [n] * B).cumsum(0).to(torch.int32)
    kvp = torch.tensor([0] + prefixes).cumsum(0).to(torch.int32)
    idx = torch.randperm(200)[: sum(prefixes)].to(torch.int32)
    kb = torch.randn(200, KH, lk)
    vb = kb[..., :lv] if KH == 1 else torch.randn(200, KH, lv)  # MLA: the value is the latent part of the key
    q, ke = torch.randn(B * n, H, lk), torch.randn(B * n, KH, lk)
    ve = ke[..., :lv].contiguous() if KH == 1 else torch.randn(B * n, KH, lv)
    masks, mptr = [], [0]
    for p in prefixes:  # FULL_MASK layout: n rows of prefix + n cells; each draft token sees some earlier ones
        m = torch.ones(n, p + n, dtype=torch.bool)
        m[:, p:] = torch.tril(torch.randint(0, 2, (n, n)).bool()) | torch.eye(n, dtype=torch.bool)
        masks.append(m.flatten())
        mptr.append(mptr[-1] + m.numel())
    cm, mptr = torch.cat(masks), torch.tensor(mptr, dtype=torch.int64)
    ref, ours = torch.zeros(B * n, H, lv), torch.zeros(B * n, H, lv)
    extend_attention_fwd(q, ke, ve, ref, kb, vb, qo, kvp, idx, cm, True, mptr, n, 1.0, 1.0, 0.09)
    mla_verify_attention(q, ke, ve, ours, kb, vb, qo, kvp, idx, cm, mptr, 0.09)
    worst = max(worst, (ref - ours).abs().max().item())
print(json.dumps(worst))
"""


def test_torch_mla_verify_matches_sglang_triton_extend_kernel_with_tree_mask():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", MLA_VERIFY], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) < 1e-5


def test_verify_patch_is_installed_on_mla_backends_only_for_masked_extends():
    """The wrapper sends anything but a masked extend (prefill, capture, draft extend) to SGLang's kernel."""
    import types

    import torch

    from eaglebox_dev import cpu_patches

    calls = []

    class Backend:
        def __init__(self, use_mla):
            self.use_mla = use_mla
            self.decode_attention_fwd = lambda *a, **k: calls.append("triton-decode")
            self.extend_attention_fwd = lambda *a, **k: calls.append("triton-extend")

    module = types.SimpleNamespace(TritonAttnBackend=Backend)
    cpu_patches._torch_mla_decode(module)
    q, kv = torch.randn(2, 2, 8), torch.randn(4, 1, 8)
    o = torch.zeros(2, 2, 4)
    qo, kvp, idx = torch.tensor([0, 2]), torch.tensor([0, 2]), torch.tensor([0, 1])
    mask, mptr = torch.ones(8, dtype=torch.bool), torch.tensor([0, 8])
    mla = Backend(True)
    mla.extend_attention_fwd(q, kv[:2], kv[:2, :, :4], o, kv, kv[..., :4], qo, kvp, idx, None, True, None, 2,
                             1.0, 1.0, 0.3)  # no mask: a prefill
    mla.extend_attention_fwd(q, kv[:2], kv[:2, :, :4], o, kv, kv[..., :4], qo, kvp, idx, mask, True, mptr, 2,
                             1.0, 1.0, 0.3, logit_cap=30.0)  # an option the torch version does not implement
    assert calls == ["triton-extend", "triton-extend"] and not o.any()
    mla.extend_attention_fwd(q, kv[:2], kv[:2, :, :4], o, kv, kv[..., :4], qo, kvp, idx, mask, True, mptr, 2,
                             1.0, 1.0, 0.3)
    assert len(calls) == 2 and o.abs().sum() > 0  # the verify went to torch
    Backend(False).extend_attention_fwd(q, kv[:2], kv[:2, :, :4], o, kv, kv[..., :4], qo, kvp, idx, mask, True,
                                        mptr, 2, 1.0, 1.0, 0.3)
    assert calls[-1] == "triton-extend"  # not MLA: untouched


ROPE = r"""
import json, torch
from eaglebox_dev.cpu_patches import _default_rope_on_cpu
from sglang.srt.layers.rotary_embedding import factory
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
yarn = {"rope_type": "deepseek_yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
if "_default_rope_on_cpu" not in factory.get_rope_cpu.__qualname__:  # eaglebox's activation installs it
    _default_rope_on_cpu(factory)
# the MLA draft's RoPE (rope dim 32, interleaved, default frequencies), as SGLang builds it on every other device
ours = factory.get_rope_wrapper(32, 32, 4096, 10000, False, None, torch.float32, device="cpu")
ref = RotaryEmbedding(32, 32, 4096, 10000, False, torch.float32)
pos, q, k = torch.arange(9), torch.randn(9, 4, 32), torch.randn(9, 1, 32)
a, b = ours(pos, q.clone(), k.clone()), ref.forward_native(pos, q.clone(), k.clone())
yarn_rope = factory.get_rope_wrapper(32, 32, 4096, 50000, False, yarn, torch.float32, device="cpu")
print(json.dumps({"cls": type(ours).__name__, "yarn_cls": type(yarn_rope).__name__,
                  "diff": max((a[0] - b[0]).abs().max().item(), (a[1] - b[1]).abs().max().item())}))
"""


def test_default_rope_builds_on_cpu_as_on_other_devices():
    """The MLA-form draft's RoPE (no scaling block) is SGLang's RotaryEmbedding on CPU too (unpatched, SGLang
    0.5.23 refuses it there: ``assert rope_scaling is not None``, the served MLA draft failed to load); yarn is
    untouched."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}  # SGLang as its CPU engine runs (is_cpu())
    out = subprocess.run([sys.executable, "-c", ROPE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["cls"] == "RotaryEmbedding" and r["diff"] == 0.0, r
    assert r["yarn_cls"] == "DeepseekScalingRotaryEmbedding", r


YARN_AFTER_SGLANG = r"""
import sys, torch
import sglang.srt.utils.common as c
assert not c.is_cpu()  # asked before SGLANG_USE_CPU_ENGINE is set (and cached), as the trainer's config check does
from eaglebox.draft.export import export_draft
from eaglebox.draft.sglang_class import SGLangDraft
from eaglebox.draft.spec import DraftSpec
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.model import Eagle3Draft
yarn = {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}
s = DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=96, vocab_size=128, draft_vocab_size=64, rms_norm_eps=1e-5,
              rope_theta=50000.0, rope_scaling=yarn, max_position_embeddings=4096)
d = export_draft(sys.argv[1], s, trainable_state(Eagle3Draft(s)), {"layer_ids": [1, 2, 3]}, torch.float32)
print(*{type(m).__name__ for m in SGLangDraft(d).model.modules() if "Rotary" in type(m).__name__})
"""


def test_llama_draft_with_a_yarn_rope_loads_on_cpu_after_sglang_was_imported_without_the_cpu_engine(tmp_path):
    """The trainer's in-process held-out evaluation on the CPU: SGLang's ``is_cpu()`` is cached False by an
    earlier import (the config's backend check), and the Llama-form draft of a Kimi target copies its yarn
    RoPE, whose CUDA path imports vllm (found running the Kimi check's CPU smoke)."""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    out = subprocess.run([sys.executable, "-c", YARN_AFTER_SGLANG, str(tmp_path / "d")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "YaRNScalingRotaryEmbedding"


EMBED = r"""
import json, sys, torch
from eaglebox.draft.export import export_draft
from eaglebox.draft.sglang_class import SGLangDraft
from eaglebox.draft.spec import DraftSpec
from eaglebox.train.checkpoint import trainable_state
from eaglebox.train.model import Eagle3Draft
from eaglebox_dev.cpu_patches import _mla_draft_embed_without_cuda
s = DraftSpec(hidden_size=64, target_hidden_size=64, num_aux=3, num_attention_heads=4, num_key_value_heads=4,
              head_dim=24, intermediate_size=96, vocab_size=128, draft_vocab_size=64, rms_norm_eps=1e-5,
              rope_theta=10000.0, rope_scaling=None, max_position_embeddings=256, architecture="deepseek_mla",
              q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
d = export_draft(sys.argv[1], s, trainable_state(Eagle3Draft(s)), {"layer_ids": [1, 2, 3]}, torch.float32)
model = SGLangDraft(d).model  # SGLang's Eagle3DeepseekV2ForCausalLM
embed, head = torch.randn(128, 64), torch.randn(64, 64)
try:
    model.set_embed(embed)
    before = "ok"
except (RuntimeError, AssertionError) as e:  # SGLang 0.5.23 as shipped: torch.cuda.synchronize() without a GPU
    before = type(e).__name__
import sglang.srt.models.kimi_k25_eagle3 as m
if "cpu_set_embed" not in m.Eagle3DeepseekV2ForCausalLM.set_embed.__qualname__:
    _mla_draft_embed_without_cuda(m)
model.set_embed(embed)
shared = model.model.embed_tokens.weight is embed
model.set_embed_and_head(embed, head)
print(json.dumps({"before": before, "shared": shared, "head": model.lm_head.weight is head}))
"""


def test_mla_draft_takes_the_targets_embedding_without_cuda_calls(tmp_path):
    """The speculative server hands the target's embedding to SGLang's MLA draft class (``set_embed``),
    which ends in ``torch.cuda.synchronize()``: on a machine without a GPU the server died there."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    out = subprocess.run([sys.executable, "-c", EMBED, str(tmp_path / "draft")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["shared"] and r["head"], r
