"""SGLang 0.5.23's own draft class (``LlamaForCausalLMEagle3`` or ``Eagle3DeepseekV2ForCausalLM``, as the
export's ``architectures`` says), loaded from an export and run outside a server.

Used by the offline acceptance evaluator and by the export parity tests: SGLang's weight loader
(``midlayer`` -> ``layers.0``, stacked ``qkv_proj``/``gate_up_proj``, MLA's fused
``fused_qkv_a_proj_with_mqa`` and ``w_kc``/``w_vc`` split, ``d2t`` -> ``hot_token_id``), its norms,
fc, rotary embedding, MLA absorbed projections, MLP and residual wiring all run as in the server.
Only the paged ``RadixAttention`` is replaced, by exact attention over an explicit per-position KV
cache (for MLA: the latent and RoPE key, SGLang's ``attn_mqa`` inputs, with the absorbed forward
SGLang's non-fused backends run): the server's KV pool and attention backends are what SGLang
itself tests, and on CPU its speculative path needs Triton's interpreter and a patch (docs/cpu-support.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from eaglebox.engine.server import free_port

_INITIALISED = False


def _init_sglang_runtime(cpu: bool) -> None:
    """SGLang's layers need a process group and published model-parallel topology even at tp 1: a
    world-1 gloo group, ``ServerArgs`` of SGLang's no-model sentinel ``dummy`` published under its
    unrestricted ``test`` role, tp = pp = ep = 1; once per process. (SGLang's
    own ``sglang.test.layer_ut_utils`` does the same, but its module pulls the test package's imports.)
    On the CPU, SGLang's CPU engine (its layers' CPU code paths); on a GPU its CUDA ones, as served."""
    global _INITIALISED
    if _INITIALISED:
        return
    if cpu:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        from sglang.srt.utils.common import is_cpu

        # cached: an earlier SGLang import in this process (the config's backend check) asked before the
        # variable was set, and a module imported now (the yarn RoPE's) would take the CUDA path and need vllm
        is_cpu.cache_clear()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if not torch.distributed.is_initialized():
        # the store's address given here, not through MASTER_PORT: a port left in os.environ is inherited by
        # child processes, whose own store then finds it taken by this one (EADDRINUSE)
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                    distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    if not parallel_state.model_parallel_is_initialized():
        reset_context()
        publish(ServerArgs(model_path="dummy", tp_size=1, ep_size=1, pp_size=1), role="test",
                ranks=SpawnRanks(world_rank=0))
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        parallel_state.initialize_model_parallel(backend="gloo")
    _INITIALISED = True


class CachedAttention(torch.nn.Module):
    """Stands in for ``RadixAttention``: keys and values are kept by position; a query attends to
    every cached key at a position not after its own (one chain: topk 1)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float, dtype, device):
        super().__init__()
        self.h, self.kv, self.d, self.scaling = num_heads, num_kv_heads, head_dim, scaling
        self.dtype, self.device = dtype, device
        self.reset()

    def reset(self) -> None:
        self.pos = torch.empty(0, dtype=torch.int64, device=self.device)
        self.k = torch.empty(0, self.kv, self.d, dtype=self.dtype, device=self.device)
        self.v = torch.empty(0, self.kv, self.d, dtype=self.dtype, device=self.device)

    def truncate(self, keep_positions_below: int) -> None:
        keep = self.pos < keep_positions_below
        self.pos, self.k, self.v = self.pos[keep], self.k[keep], self.v[keep]

    def forward(self, q, k, v, forward_batch):
        n = q.shape[0]
        pos = forward_batch.positions
        self.pos = torch.cat([self.pos, pos])
        self.k = torch.cat([self.k, k.view(n, self.kv, self.d).to(self.k.dtype)])
        self.v = torch.cat([self.v, v.view(n, self.kv, self.d).to(self.v.dtype)])
        rep = self.h // self.kv
        keys = self.k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [h, K, d]
        vals = self.v.repeat_interleave(rep, dim=1).transpose(0, 1)
        qh = q.view(n, self.h, self.d).transpose(0, 1).to(keys.dtype)  # [h, n, d]
        scores = (qh @ keys.transpose(1, 2)) * self.scaling
        scores = scores.masked_fill(self.pos[None, None, :] > pos[None, :, None], float("-inf"))
        out = scores.softmax(-1) @ vals  # [h, n, d]
        return out.transpose(0, 1).reshape(n, self.h * self.d).to(q.dtype)


class CachedMLAAttention(torch.nn.Module):
    """Stands in for MLA's ``attn_mqa``: one shared key a token (latent + RoPE key), kept by position;
    the values are its first ``kv_lora_rank`` columns. q: [n, heads, kv_lora_rank + rope] (absorbed)."""

    def __init__(self, num_heads: int, kv_lora_rank: int, rope_dim: int, scaling: float, dtype, device):
        super().__init__()
        self.h, self.lora, self.d, self.scaling = num_heads, kv_lora_rank, kv_lora_rank + rope_dim, scaling
        self.dtype, self.device = dtype, device
        self.reset()

    def reset(self) -> None:
        self.pos = torch.empty(0, dtype=torch.int64, device=self.device)
        self.k = torch.empty(0, self.d, dtype=self.dtype, device=self.device)

    def truncate(self, keep_positions_below: int) -> None:
        keep = self.pos < keep_positions_below
        self.pos, self.k = self.pos[keep], self.k[keep]

    def forward(self, q, k, v, forward_batch, save_kv_cache=True, **kw):
        if kw:
            raise NotImplementedError(f"MLA attention options {sorted(kw)}")
        n, pos = q.shape[0], forward_batch.positions
        self.pos = torch.cat([self.pos, pos])
        self.k = torch.cat([self.k, k.reshape(n, self.d).to(self.k.dtype)])
        scores = torch.einsum("nhd,kd->hnk", q.view(n, self.h, self.d).to(self.k.dtype), self.k) * self.scaling
        scores = scores.masked_fill(self.pos[None, None, :] > pos[None, :, None], float("-inf"))
        out = torch.einsum("hnk,kl->nhl", scores.softmax(-1), self.k[:, : self.lora])
        return out.reshape(n, self.h * self.lora).to(q.dtype)


def _load_llama(draft_dir: Path):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    model = LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(draft_dir))
    return model, model.model.layers[0].self_attn


def _load_mla(draft_dir: Path):
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM
    from transformers import DeepseekV3Config

    model = Eagle3DeepseekV2ForCausalLM(DeepseekV3Config.from_pretrained(draft_dir))
    return model, model.model.midlayer.self_attn


class SGLangDraft:
    def __init__(self, draft_dir: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        _init_sglang_runtime(self.device.type == "cpu")
        from safetensors.torch import load_file

        arch = json.loads((Path(draft_dir) / "config.json").read_text())["architectures"][0]
        self.mla = arch == "Eagle3DeepseekV2ForCausalLM"
        self.model, attn = (_load_mla if self.mla else _load_llama)(draft_dir)
        self.model.load_weights(load_file(Path(draft_dir) / "model.safetensors").items())
        self.model.to(device=self.device, dtype=dtype).eval()
        if self.mla:
            from sglang.srt.models.deepseek_common.attention_forward_methods import AttnForwardMethod

            self.model.post_load_weights()  # w_kc / w_vc again, in ``dtype``
            self.attn = CachedMLAAttention(attn.num_local_heads, attn.kv_lora_rank, attn.qk_rope_head_dim,
                                           attn.scaling, dtype, self.device)
            attn.attn_mqa = self.attn
            # the absorbed MLA forward, core through attn_mqa as SGLang's Triton backend runs it
            attn.current_attention_backend = "triton"
            attn.dispatch_attn_forward_method = lambda forward_batch: AttnForwardMethod.MLA
        else:
            self.attn = CachedAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scaling, dtype,
                                        self.device)
            attn.attn = self.attn
        self.dtype = dtype
        self.hot_token_id = self.model.hot_token_id

    def set_embed(self, embed: torch.Tensor) -> None:
        """SGLang shares the target's embedding with the draft (``set_embed``)."""
        with torch.no_grad():
            self.model.model.embed_tokens.weight[: embed.shape[0]].copy_(embed.to(self.dtype))  # rows padded to 64

    def reset(self) -> None:
        self.attn.reset()

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """One draft forward over ``n`` tokens: hidden is [n, k*H] (target features: fc applies) or
        [n, H] (the draft's own output). Returns (draft-vocab logits [n, V_d], next hidden [n, H])."""
        tokens, hidden, positions = (x.to(self.device) for x in (tokens, hidden, positions))
        fb = SimpleNamespace(
            mm_input_embeds=None, positions=positions,
            forward_mode=SimpleNamespace(is_extend=lambda: False, is_draft_extend_v2=lambda: False),
            contains_mm_inputs=lambda: False, spec_info=SimpleNamespace(hidden_states=hidden.to(self.dtype)),
            attn_cp_metadata=None,  # MLA: no context parallelism
        )
        normed, aux = self.model.model(tokens, positions, fb)
        return normed @ self.model.lm_head.weight[: self.model.config.draft_vocab_size].T, aux[0]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.hot_token_id[draft_ids]
