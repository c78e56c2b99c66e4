"""The CPU image on a real Docker engine: extract -> train -> serve -> bench in containers, and the
compose stack with the CPU override. testcontainers drives the containers; the image is built with
the engine's BuildKit (the Dockerfile builds only the variant it is asked for)."""

import json
import os
import re
import subprocess
import time

import pytest
import requests
from testcontainers.compose import DockerCompose
from testcontainers.core.container import DockerContainer

from conftest import GREEDY, ROOT, free_port
from eaglebox.stages.check import RANDOM_CONTROL_MAX_AL

pytestmark = pytest.mark.docker
IMAGE = "eaglebox:cpu"
DOCKER = "/usr/bin/docker"  # Debian's 20.10 client: BuildKit without buildx


@pytest.fixture(scope="module")
def cpu_image():
    assert subprocess.run([DOCKER, "info"], capture_output=True).returncode == 0, \
        "no Docker engine: run docker/engine-setup.sh (as .ci/run does)"
    assert (ROOT / ".cache" / "wheels").is_dir(), "no wheels for the CPU image: run `make wheels`"
    r = subprocess.run([DOCKER, "build", "--network", "host", "--build-arg", "VARIANT=cpu",
                        "--build-arg", "CPU_BASE_IMAGE=local/debian:bookworm", "-t", IMAGE, "."],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"},
                       timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "capture hook accepts SGLang 0.5.23" in r.stderr + r.stdout or "CACHED" in r.stderr
    return IMAGE


def lane_container(image: str, **kwargs) -> DockerContainer:
    """A container of ``image`` with the lane's torch threads (make test's ``OMP_NUM_THREADS``), which a container
    does not inherit: without it torch in the container takes every core, and its OpenMP threads spin against
    the other lane's work (docs/testing.md)."""
    c = DockerContainer(image).with_kwargs(**kwargs)
    threads = os.environ.get("OMP_NUM_THREADS")
    return c.with_env("OMP_NUM_THREADS", threads) if threads else c


def run_to_end(image, args, volumes, timeout=900) -> str:
    c = lane_container(image, network_mode="host").with_command(args)
    for host, (cont, mode) in volumes.items():
        c = c.with_volume_mapping(str(host), cont, mode)
    c.start()
    try:
        result = c.get_wrapped_container().wait(timeout=timeout)
        logs = c.get_wrapped_container().logs().decode(errors="replace")
        assert result["StatusCode"] == 0, logs[-4000:]
        return logs
    finally:
        c.stop()


LOOP_PATHS = ["model.path=/models/tiny/target", "extract.dataset=/models/tiny/data/train.jsonl",
              "extract.output_dir=/data/shards", "train.output_dir=/data/train"]


@pytest.fixture(scope="module")
def loop_dirs(cpu_image, tiny_target, tmp_path_factory):
    data = tmp_path_factory.mktemp("container-data")
    data.chmod(0o777)
    volumes = {tiny_target.parent: ("/models/tiny", "ro"), ROOT / "configs": ("/configs", "ro"), data: ("/data", "rw")}
    paths = LOOP_PATHS
    # greedy answers (conftest.GREEDY): 96 samples and 80 steps reach the served margin below on them
    run_to_end(cpu_image, ["extract", "--config", "/configs/tiny-cpu.yaml", *paths, f"engine.port={free_port()}",
                           "extract.max_samples=96", "extract.regenerate_max_new_tokens=24",
                           *GREEDY], volumes)
    run_to_end(cpu_image, ["train", "--config", "/configs/tiny-cpu.yaml", *paths, "train.max_steps=80",
                           "train.max_length=320"], volumes)
    return data, volumes


def test_image_prints_usage_and_runs_as_a_user(cpu_image):
    logs = run_to_end(cpu_image, [], {})
    assert "usage: <extract|train|export|parity|serve|bench|check>" in logs
    c = lane_container(cpu_image, entrypoint=["id", "-u"])
    c.start()
    try:
        c.get_wrapped_container().wait(timeout=60)
        assert c.get_wrapped_container().logs().decode().strip() == "1000"
    finally:
        c.stop()


IMPORT_ALL = """
import importlib, importlib.metadata as md, pkgutil, sys
import eaglebox, eaglebox_dev
failed, names = [], []
for pkg in (eaglebox, eaglebox_dev):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".", onerror=lambda n: failed.append((n, "walk"))):
        names.append(m.name)
        try:
            importlib.import_module(m.name)
        except BaseException as e:  # every module, nothing skipped silently
            failed.append((m.name, repr(e)))
dist = md.distribution("eaglebox")
print("imported", len(names), "modules; requires", dist.requires)
sys.exit("failed: %r" % failed if failed else 0)
"""


def test_every_module_imports_from_the_installed_run_time_deps(cpu_image):
    """Every eaglebox (and eaglebox_dev) module imports in the image: its declared run-time deps and the
    `dev` extra were installed by the image build, nothing from the test tools."""
    c = lane_container(cpu_image, entrypoint=["python3", "-c", IMPORT_ALL], network_mode="host")
    c.start()
    try:
        result = c.get_wrapped_container().wait(timeout=300)
        logs = c.get_wrapped_container().logs().decode(errors="replace")
    finally:
        c.stop()
    assert result["StatusCode"] == 0, logs[-4000:]
    assert "imported" in logs and int(logs.split("imported ")[1].split()[0]) >= 40, logs[-2000:]
    # the test tools are an extra, not installed in the image
    probe = lane_container(
        cpu_image, entrypoint=["python3", "-c", "import importlib.util as u; print([m for m in ('pytest', 'testcontainers') if u.find_spec(m)])"],
        network_mode="host")
    probe.start()
    try:
        probe.get_wrapped_container().wait(timeout=120)
        assert probe.get_wrapped_container().logs().decode().strip() == "[]"
    finally:
        probe.stop()


SERVED = ["model.path=/models/tiny/target", "bench.prompts=/models/tiny/data/heldout.jsonl", "bench.num_prompts=4",
          "bench.max_new_tokens=24", "bench.concurrency=[1]", "bench.min_accept_length=null"]
MARGIN = 0.3
"""Measured 2026-12-04: trained 1.625, control 1.054 (4 prompts x 24 tokens, 80 steps). The trained
draft's served AL must exceed the random-weights control's by this much, and the control
must stay at or below the gate's ``RANDOM_CONTROL_MAX_AL`` (as ``eaglebox check`` compares them in
``tests/integration/test_export_and_gate.py``): AL counts the verified token, so any draft reaches 1.0."""

RANDOM_DRAFT = """
from pathlib import Path
import sys
from eaglebox.config import load_config
from eaglebox.train.control import export_control_draft
print(export_control_draft(Path("/data/train/draft"), Path("/data/random-draft"), load_config(sys.argv[1], sys.argv[2:]).train.seed))
"""


def wait_health(url: str, container, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status == "exited":
            raise AssertionError("the server container exited:\n" + wrapped.logs().decode(errors="replace")[-4000:])
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy after {timeout} s")


def serve_and_bench(image, volumes, draft: str, out: str) -> dict:
    """Serve ``draft`` with the target in one container, bench it from another; the bench report."""
    port = free_port()
    server = lane_container(image, network_mode="host").with_command(
        ["serve", "--config", "/configs/tiny-cpu-served.yaml", *SERVED, f"serve.draft_path={draft}",
         f"engine.port={port}"])
    for host, (cont, mode) in volumes.items():
        server = server.with_volume_mapping(str(host), cont, mode)
    server.start()
    try:
        wait_health(f"http://127.0.0.1:{port}", server)
        run_to_end(image, ["bench", "--config", "/configs/tiny-cpu-served.yaml", *SERVED, f"serve.draft_path={draft}",
                           f"bench.url=http://127.0.0.1:{port}", f"bench.output_dir={out}"], volumes)
    finally:
        server.stop()
    return json.loads((volumes_root(volumes) / out.removeprefix("/data/") / "bench.json").read_text())


def volumes_root(volumes):
    return next(host for host, (cont, _) in volumes.items() if cont == "/data")


@pytest.fixture(scope="module")
def random_control(cpu_image, loop_dirs):
    """A draft of the trained one's shape and vocabulary with seeded initial weights (``eaglebox check``'s
    negative control), exported and served in containers as the trained one is."""
    data, volumes = loop_dirs
    c = lane_container(
        cpu_image, entrypoint=["python3", "-c", RANDOM_DRAFT, "/configs/tiny-cpu.yaml", *LOOP_PATHS], network_mode="host")
    for host, (cont, mode) in volumes.items():
        c = c.with_volume_mapping(str(host), cont, mode)
    c.start()
    try:
        result = c.get_wrapped_container().wait(timeout=600)
        logs = c.get_wrapped_container().logs().decode(errors="replace")
    finally:
        c.stop()
    assert result["StatusCode"] == 0, logs[-4000:]
    return serve_and_bench(cpu_image, volumes, "/data/random-draft", "/data/bench-random")


def test_extract_train_serve_bench_in_containers(cpu_image, loop_dirs, random_control):
    """Extract and train in containers; the random-weights control served from one container and benched
    from another. The trained draft is served by the compose stack (``test_compose_stack_with_cpu_override``),
    as users serve it, and compared there with this control."""
    data, volumes = loop_dirs
    manifest = json.loads((data / "shards" / "manifest.json").read_text())
    assert manifest["capture"]["engine_version"] == "0.5.23" and manifest["samples"] > 0
    assert (data / "train" / "draft" / "config.json").exists()
    assert random_control["engine_version"] == "0.5.23" and random_control["acceptance"]["verify_ct"] > 0
    assert random_control["acceptance"]["accept_length"] <= RANDOM_CONTROL_MAX_AL


def edit(text: str, *pairs: tuple[str, str]) -> str:
    """Replace each (old, new) in a config's text; a line the config no longer has fails loudly."""
    for old, new in pairs:
        assert old in text, f"the config no longer has {old!r}"
        text = text.replace(old, new)
    return text


def test_compose_stack_with_cpu_override(cpu_image, loop_dirs, random_control, tiny_target, tmp_path):
    data, _ = loop_dirs
    models = tmp_path / "models"
    models.mkdir()
    subprocess.run(["cp", "-r", str(tiny_target), str(models / "target")], check=True)
    subprocess.run(["cp", "-r", str(data / "train" / "draft"), str(models / "draft")], check=True)
    subprocess.run(["cp", str(tiny_target.parent / "data" / "heldout.jsonl"), str(models)], check=True)
    configs = tmp_path / "configs"
    configs.mkdir()
    text = (ROOT / "configs" / "tiny-cpu-served.yaml").read_text()
    text = edit(text, ("path: .cache/tiny/target", "path: /models/target"),
                ("draft_path: runs/tiny/train/draft", "draft_path: /models/draft"),
                ("prompts: .cache/tiny/data/heldout.jsonl", "prompts: /models/heldout.jsonl"),
                ("num_prompts: 16", "num_prompts: 4"), ("max_new_tokens: 48", "max_new_tokens: 24"),  # as SERVED
                ("concurrency: [1, 4]", "concurrency: [1]"),
                ("output_dir: runs/tiny/bench-served", "output_dir: /data/bench"),
                # an 80-step draft: compared below with the random-weights control served the same way,
                # not with the gate's bar
                ("min_accept_length: 1.8", "min_accept_length: null"))
    (configs / "tiny.yaml").write_text(text)
    (configs / "extract.yaml").write_text(edit((ROOT / "configs" / "tiny-cpu.yaml").read_text(),
                                               ("path: .cache/tiny/target", "path: /models/target"),
                                               ("dataset: .cache/tiny/data/train.jsonl", "dataset: /data/datasets/chat.jsonl"),
                                               ("output_dir: runs/tiny/shards", "output_dir: /data/compose-shards")))
    port = free_port()
    env = tmp_path / "compose.env"
    datasets = tmp_path / "datasets"  # the user's data sets, mounted as the README says (EAGLEBOX_DATA)
    datasets.mkdir()
    subprocess.run(["cp", str(tiny_target.parent / "data" / "train.jsonl"), str(datasets / "chat.jsonl")], check=True)
    env.write_text(f"EAGLEBOX_IMAGE={cpu_image}\nEAGLEBOX_MODELS={models}\nEAGLEBOX_CONFIGS={configs}\n"
                   f"EAGLEBOX_DATA={datasets}\n"
                   f"EAGLEBOX_CONFIG=tiny.yaml\nEAGLEBOX_PORT={port}\nEAGLEBOX_START_PERIOD=600s\n")
    stack = DockerCompose(str(ROOT / "compose"), compose_file_name=["compose.yaml", "compose.cpu.yaml"],
                          env_file=str(env), services=["target"], wait=True)
    project = ["--project-name", stack.project_name] if getattr(stack, "project_name", None) else []
    base = [DOCKER, "compose", *project, "--env-file", str(env), "-f", "compose.yaml", "-f", "compose.cpu.yaml"]
    try:
        stack.start()
    except subprocess.CalledProcessError as err:  # `up --wait` saw the target exit: its own log says why
        out, logs = stack.get_logs("target")
        stack.stop()
        raise AssertionError(f"{err.stderr}\ntarget's log:\n{(out + logs)[-6000:]}") from None
    try:
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        r = subprocess.run([*base, "--profile", "bench-served", "run", "--rm", "bench-served"], cwd=ROOT / "compose",
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert re.search(r'"sglang": "0.5.23"', r.stdout), r.stdout[-3000:]
        trained = float(re.search(r'"accept_length": ([0-9.]+)', r.stdout).group(1))
        control = random_control["acceptance"]["accept_length"]
        print(json.dumps({"trained_served_by_compose": trained, "random_control": control}))
        assert trained >= control + MARGIN, r.stdout[-3000:]
    finally:
        stack.stop()
    # `docker compose run extract` reads the JSONL mounted from EAGLEBOX_DATA at /data/datasets
    r = subprocess.run([*base, "--profile", "extract", "run", "--rm", "extract", "extract", "--config", "/configs/extract.yaml",
                        "extract.max_samples=8", "extract.regenerate_max_new_tokens=8", f"engine.port={free_port()}"],
                       cwd=ROOT / "compose", capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = subprocess.run([*base, "--profile", "extract", "run", "--rm", "--entrypoint", "cat", "extract",
                          "/data/compose-shards/manifest.json"], cwd=ROOT / "compose", capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and json.loads(out.stdout)["samples"] > 0, out.stdout[-2000:] + out.stderr[-2000:]
    subprocess.run([*base, "down", "--volumes"], cwd=ROOT / "compose", capture_output=True, timeout=120)
