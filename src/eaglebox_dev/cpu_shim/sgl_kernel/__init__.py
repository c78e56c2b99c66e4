"""CPU stand-in for ``sgl_kernel`` (SGLang 0.5.23 on a machine without a GPU driver).

Put on ``sys.path`` only by the CPU install (``python -m eaglebox.engine.install --variant cpu``). It exports
exactly the functions SGLang's CPU engine imports (torch versions in ``eaglebox_dev.cpu_kernels``);
every other name raises ImportError so SGLang's own ``try: from sgl_kernel ... except ImportError``
fallbacks keep working, and ``torch.ops.sgl_kernel`` stays unregistered so SGLang sees no AMX.
"""

from eaglebox_dev.cpu_kernels import *  # noqa: F403
from eaglebox_dev.cpu_kernels import CPU_KERNELS

__version__ = "0.0.0+eaglebox.cpu"
__all__ = list(CPU_KERNELS)


def __getattr__(name):
    raise AttributeError(f"the eaglebox CPU stand-in for sgl_kernel has no {name!r}")
