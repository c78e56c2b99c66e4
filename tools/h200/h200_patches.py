"""SGLang 0.5.23 on the lent H200 only.

- ``DualGemm._select_mode`` imports the CuTe-DSL kernel (nvidia-cutlass-dsl, not carried)
  unconditionally on CUDA; without it the dense path is taken.
- EAGLE tree kernels. On CUDA, SGLang's EAGLE worker builds the draft tree and verifies it greedily
  with its own JIT CUDA module (``sglang/kernels/ops/speculative/tree.py``: ``tree.cuh`` compiled by
  nvcc through tvm-ffi at first use), not with ``sgl_kernel``; the draft cache locations, bonus tokens,
  top-1 and the verify argmax are SGLang's Triton kernels. Nothing there reaches the ``sgl_kernel``
  stand-in. Should that JIT module not build on the device, :func:`tree_kernels` puts SGLang's own
  Triton implementations of the same two kernels (``spec_tree.sgl_build_tree_kernel_triton`` and
  ``verify_tree_greedy_triton``, what SGLang uses on XPU) in its place and says so on stderr.
  ``EAGLEBOX_H200_TREE_KERNELS``: ``auto`` (default: JIT, Triton if it fails to build), ``jit``
  (fail as SGLang would) or ``triton``.
"""

from __future__ import annotations

import os
import sys

from eaglebox.engine.post_import import on_import

TREE = "sglang.kernels.ops.speculative.tree"


def _no_dual_gemm(module) -> None:
    module.DualGemm._select_mode = lambda self, *args, **kwargs: None


def tree_kernels(module) -> None:
    """Wrap ``module.build_tree_kernel_efficient`` / ``verify_tree_greedy`` (the JIT ones) so that the
    first call decides, once a process, between the JIT module and SGLang's Triton kernels."""
    jit_build, jit_verify = module.build_tree_kernel_efficient, module.verify_tree_greedy
    chosen: dict[str, bool] = {}

    def use_jit() -> bool:
        if "jit" not in chosen:
            mode = os.environ.get("EAGLEBOX_H200_TREE_KERNELS", "auto")
            if mode not in ("auto", "jit", "triton"):
                raise ValueError(f"EAGLEBOX_H200_TREE_KERNELS={mode!r}: auto, jit or triton")
            chosen["jit"] = mode != "triton"
            if chosen["jit"]:
                try:
                    module._jit_tree_module()
                except Exception as err:  # noqa: BLE001 -- any build failure: nvcc missing, headers, tvm-ffi
                    if mode == "jit":
                        raise
                    chosen["jit"] = False
                    print(f"eaglebox-h200: SGLang's JIT tree kernels did not build ({type(err).__name__}: "
                          f"{str(err)[:300]}); using SGLang's Triton tree kernels", file=sys.stderr, flush=True)
            print(f"eaglebox-h200: EAGLE tree kernels: {'SGLang JIT (tree.cuh)' if chosen['jit'] else 'SGLang Triton'}",
                  file=sys.stderr, flush=True)
        return chosen["jit"]

    def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode):
        args = (parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode)
        if use_jit():
            return jit_build(*args)
        from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton

        return sgl_build_tree_kernel_triton(*args[:-1], TreeMaskMode(int(tree_mask_mode)))

    def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, target_predict):
        args = (predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                retrive_next_sibling, target_predict)
        if use_jit():
            return jit_verify(*args)
        from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

        return verify_tree_greedy_triton(*args)

    module.build_tree_kernel_efficient = build_tree_kernel_efficient
    module.verify_tree_greedy = verify_tree_greedy


on_import("sglang.srt.layers.dual_gemm", _no_dual_gemm)
on_import(TREE, tree_kernels)
