"""No import of a private name across packages (issue 40), read from the source (ast, nothing imported).

A name that starts with ``_`` is its module's own business: it may change or go without notice, so a
caller elsewhere that imports it couples to a detail. Within one package of ``eaglebox`` (``extract``,
``shards``, ...) modules may share such names; from another package, or from the tests, tools and
benchmarks outside ``src``, only public names are imported. Lazy imports inside functions count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
OUTSIDE = ("tests", "tools", "benchmarks")  # not in any package of eaglebox: every private import counts
KNOWN = {  # importer -> private names it still imports across packages, each with why it is left
}


def module_name(path: Path) -> str:
    """``src/eaglebox/extract/run.py`` -> ``eaglebox.extract.run``; a file outside ``src``: its path."""
    if not path.is_relative_to(SRC):
        return path.relative_to(ROOT).as_posix()
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package(module: str) -> str | None:
    """``eaglebox.train.loop`` -> ``eaglebox.train``; ``eaglebox.errors`` -> ``eaglebox.errors``;
    ``eaglebox_dev.tiny`` -> ``eaglebox_dev``; None outside ``eaglebox``/``eaglebox_dev``."""
    parts = module.split(".")
    if parts[0] == "eaglebox_dev":
        return "eaglebox_dev"
    if parts[0] != "eaglebox":
        return None
    return ".".join(parts[:2])


def private_imports(source: str, module: str, is_package: bool) -> list[tuple[str, str]]:
    """(imported module, private name) for every ``from M import _x`` / ``import M._x`` in ``source``
    where M is of ``eaglebox`` or ``eaglebox_dev`` and another package than ``module``'s."""
    out = []
    here = package(module)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            pairs = [(name, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.name.rsplit(".", 1)[0], a.name.rsplit(".", 1)[-1]) for a in node.names if "." in a.name]
        else:
            continue
        for mod, attr in pairs:
            hidden = attr.startswith("_") or any(p.startswith("_") for p in mod.split("."))
            there = package(mod)
            if hidden and there is not None and there != here:
                out.append((mod, attr))
    return out


def sources() -> list[Path]:
    files = [*SRC.rglob("*.py"), *(p for d in OUTSIDE for p in (ROOT / d).rglob("*.py"))]
    return sorted(p for p in files if "__pycache__" not in p.parts and ".venv" not in p.parts)


def offenders(files: list[Path]) -> dict[str, list[str]]:
    """Importer -> the private names it imports across packages (imports written in strings, such as
    the scripts some tests run in a subprocess, are not read)."""
    found = {}
    for path in files:
        module = module_name(path)
        names = [f"{m}.{a}" for m, a in private_imports(path.read_text(), module, path.name == "__init__.py")]
        if names:
            found[module] = sorted(set(names))
    return found


def test_no_private_name_is_imported_across_packages():
    files = sources()
    assert {"eaglebox.extract.run", "tests/unit/test_layering.py", "benchmarks/client_scale.py"} <= {
        module_name(p) for p in files}  # the walk found the tree
    found = offenders(files)
    assert {m: n for m, n in found.items() if set(n) - set(KNOWN.get(m, ()))} == {}
    stale = {m: sorted(set(n) - set(found.get(m, ()))) for m, n in KNOWN.items() if set(n) - set(found.get(m, ()))}
    assert stale == {}, "known exceptions that are gone: remove them from KNOWN"


def test_the_rule_sees_what_it_should():
    assert private_imports("from eaglebox.extract.plan import _bad", "eaglebox.stages.extract", False) == [
        ("eaglebox.extract.plan", "_bad")]
    assert private_imports("def f():\n    from eaglebox.shards.format import _x, y", "tests/unit/t.py", False) == [
        ("eaglebox.shards.format", "_x")]
    assert private_imports("import eaglebox.shards._private", "benchmarks/b.py", False) == [
        ("eaglebox.shards", "_private")]
    assert private_imports("from .dataset import _bad", "eaglebox.extract.run", False) == []  # same package
    assert private_imports("from eaglebox.extract.dataset import _bad", "eaglebox.extract.run", False) == []
    assert private_imports("from ..shards.format import _x", "eaglebox.extract.run", False) == [
        ("eaglebox.shards.format", "_x")]
    assert private_imports("from os import _exit\nfrom eaglebox.errors import EagleboxError",
                           "tests/unit/t.py", False) == []
