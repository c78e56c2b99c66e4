"""SGLang 0.5.23 on the lent H200 only: ``DualGemm._select_mode`` imports the CuTe-DSL kernel
(nvidia-cutlass-dsl, not carried) unconditionally on CUDA; without it the dense path is taken."""

from eaglebox.engine.post_import import on_import


def _no_dual_gemm(module) -> None:
    module.DualGemm._select_mode = lambda self, *args, **kwargs: None


on_import("sglang.srt.layers.dual_gemm", _no_dual_gemm)
