"""Activate eaglebox inside an SGLang environment: ``python -m eaglebox.engine.install [--variant cpu]``.

SGLang starts its scheduler with multiprocessing ``spawn``, so a patch made in the launching process
never reaches the process that runs the model. A ``.pth`` file in site-packages runs in every
interpreter of the environment: one imports the capture hook (inert unless ``EAGLEBOX_CAPTURE_DIR``
is set), and with ``--cpu`` another puts the ``sgl_kernel`` stand-in on ``sys.path`` and installs
the CPU corrections of :mod:`eaglebox_dev.cpu_patches` (inert unless ``SGLANG_USE_CPU_ENGINE=1``), both
from the test and demo package :mod:`eaglebox_dev`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sysconfig
from pathlib import Path

CAPTURE_PTH = "eaglebox_capture.pth"
CPU_PTH = "eaglebox_cpu_shim.pth"


def install(cpu: bool, site: Path | None = None) -> list[Path]:
    site = Path(site or sysconfig.get_paths()["purelib"])
    written = [site / CAPTURE_PTH]
    written[0].write_text("import eaglebox.capture.activate\n")
    if cpu:
        from eaglebox_dev import SHIM_DIR

        spec = importlib.util.find_spec("sgl_kernel")
        if spec is not None and not str(spec.origin).startswith(str(SHIM_DIR)):
            raise SystemExit(f"a real sgl_kernel is installed at {spec.origin}; the CPU stand-in would shadow it")
        (site / CPU_PTH).write_text(f"{SHIM_DIR}\nimport eaglebox_dev.cpu_patches as p; p.install()\n")
        written.append(site / CPU_PTH)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--variant", choices=["gpu", "cpu"], default="gpu",
                   help="cpu also installs the sgl_kernel stand-in and the CPU corrections")
    for path in install(p.parse_args().variant == "cpu"):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
