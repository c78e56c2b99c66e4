"""CPU-only corrections to SGLang 0.5.23, active with the ``sgl_kernel`` stand-in (test and demo support).

**Tree-mask layout.** ``eagle_utils.default_tree_mask_mode()`` returns ``QLEN_ONLY`` on every CPU,
for the Intel AMX verify kernel. Without AMX the only CPU backend that can verify drafts is Triton
(run by its interpreter), and its target-verify reads ``custom_mask`` in the ``FULL_MASK`` layout
(``num_draft_tokens * (seq_len + num_draft_tokens)`` cells a request, see ``triton_backend.py``).
The tree kernel then writes a ``num_draft_tokens**2`` mask that is read as a longer one: the verify
attention masks the wrong cells, partly from stale buffer contents, so speculative output drifts
from greedy and differs between identical requests. Here the mode is ``FULL_MASK`` whenever AMX is
absent, which makes the Triton verify exact.
"""

from __future__ import annotations

import os

from eaglebox.engine.post_import import on_import

EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"


def _full_mask_without_amx(module) -> None:
    from sglang.srt.utils import cpu_has_amx_support

    if cpu_has_amx_support():
        return
    module.default_tree_mask_mode = lambda: module.TreeMaskMode.FULL_MASK


def install() -> None:
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        on_import(EAGLE_UTILS, _full_mask_without_amx)
