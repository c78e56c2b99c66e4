"""The part of the GPU image CI can build here (no GPU, no registry): the hash-locked Python closure in
requirements/gpu.lock, downloaded for the image's platform with pip --require-hashes, and SM120 code
in torch / sglang-kernel (flashinfer: JIT, its nvcc must target sm_120). `make gpu-closure-check`."""

import re
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.closure


def test_gpu_closure_downloads_hash_checked_and_carries_sm120():
    r = subprocess.run(["make", "gpu-closure-check"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    m = re.search(r"closure: (\d+) files, (\S+), downloaded and hash-checked", out)
    assert m and int(m[1]) >= 200, out[-2000:]
    assert re.search(r"torch-2\.14\.1-cp312.*libtorch_cuda\.so: sm_120", out)
    assert re.search(r"sglang_kernel-0\.4\.10.*common_ops.*: sm_120", out)
    assert "SM120 check: torch and sglang-kernel carry sm_120 code" in out
