"""Test and demo support, installed with eaglebox but not part of the product: the tiny CPU chat
target (:mod:`eaglebox_dev.tiny`) and SGLang 0.5.23 on a CPU -- the ``sgl_kernel`` stand-in
(``cpu_shim/``, torch code in :mod:`eaglebox_dev.cpu_kernels`) and the CPU corrections
(:mod:`eaglebox_dev.cpu_patches`), put into every interpreter by ``python -m eaglebox.engine.install
--variant cpu``."""

from pathlib import Path

SHIM_DIR = Path(__file__).parent / "cpu_shim"
"""Goes on ``sys.path``: it holds the ``sgl_kernel`` stand-in package."""
