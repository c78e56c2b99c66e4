"""make test's two lanes: tests that read one shared fixture run on one worker (tests/conftest.py's groups).

pytest-xdist's loadgroup silently stops grouping when pytest changes how node ids are kept (pytest 9.2:
pytest-xdist#1386); the shared fixtures would then be built once per worker and race each other. This runs
a small suite through the same conftest hook, with make test's LANES, and checks where each test ran."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SUITE = '''
import json, os, pytest

@pytest.fixture(scope="session")
def shared():
    return os.environ["PYTEST_XDIST_WORKER"]

def record(name):
    with open(os.environ["LANES_OUT"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_reads_shared(shared, i):
    record(f"shared{i}")

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    record(f"alone{i}")
'''


def make_lanes() -> list[str]:
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("LANES ?="):
            return line.split("?=", 1)[1].split()
    raise AssertionError("the Makefile sets no LANES")


def test_tests_that_read_one_shared_fixture_run_on_one_worker(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    text = (tmp_path / "conftest.py").read_text()
    assert 'HEAVY_FIRST = ("' in text
    (tmp_path / "conftest.py").write_text(text.replace('HEAVY_FIRST = ("', 'HEAVY_FIRST = ("shared", "', 1))
    (tmp_path / "test_suite.py").write_text(SUITE)
    out = tmp_path / "ran.jsonl"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *make_lanes(), str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LANES_OUT": str(out), "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = dict(json.loads(line) for line in out.read_text().splitlines())
    assert len(ran) == 12
    assert len({ran[f"shared{i}"] for i in range(6)}) == 1, ran  # one group, one worker
    assert len(set(ran.values())) == 2, ran  # and the other tests used the other lane
