#!/usr/bin/env python3
"""Print eaglebox's declared requirements from pyproject.toml, one a line, for `pip install -r`.

    eaglebox-requirements.py [--extra NAME]... [--without NAME]... [PYPROJECT]

The CPU venv and image use `--without sglang --without torch`: SGLang is installed with --no-deps
there (its CUDA-only packages have CPU stand-ins) and torch comes with SGLang's run-time list.
Reads pyproject.toml itself, so the images install exactly what the package declares."""

import argparse
import re
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras=(), without=()) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    skip = {w.lower().replace("_", "-") for w in without}
    out = []
    for r in reqs:
        name = re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower().replace("_", "-")
        if name not in skip and r not in out:
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--without", action="append", default=[])
    ap.add_argument("pyproject", nargs="?", default=str(Path(__file__).resolve().parents[1] / "pyproject.toml"))
    a = ap.parse_args()
    print("\n".join(requirements(Path(a.pyproject), a.extra, a.without)))


if __name__ == "__main__":
    main()
