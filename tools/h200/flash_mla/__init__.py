"""Stand-in for the ``flash_mla`` wheel (``sgl-flash-mla``, not carried to the lent GPU).

SGLang 0.5.23's EAGLE worker imports ``FlashMLABackend`` on CUDA only to list it among the backends whose
draft-extend pass takes a CUDA graph (``eagle_worker_v2._capture_cuda_graphs``, an ``isinstance`` check);
that import pulls in ``flash_mla``, so without it every speculative server on the GPU exits at start
(measured on the H200, 2026-12-07). eaglebox's GPU checks never select FlashMLA; a call into it fails loudly.
"""


def __getattr__(name: str):
    def missing(*args, **kwargs):
        raise RuntimeError(f"flash_mla.{name} called: the lent GPU has no FlashMLA (tools/h200/flash_mla stand-in)")
    return missing
