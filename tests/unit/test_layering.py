"""The package layering, read from the source (ast, nothing imported): data flows down one way.

Stages (``eaglebox.stages``, reached from ``eaglebox.cli``) may import anything. Below them, the
working packages (capture, extract, train, serve, bench) import only the shared lower layers
(config, target, draft, shards, engine) and the base modules (errors, progress, ``eaglebox``
itself), never each other; the lower layers import no working package; no two packages import
each other, directly or around a cycle. Test and demo support (``eaglebox_dev``) is reached only
by the CLI's ``tiny`` verb and the CPU install.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

BASE = {"eaglebox", "errors", "progress"}
SHARED = {"config", "target", "draft", "shards", "engine"}
WORKING = {"capture", "extract", "train", "serve", "bench"}
TOP = {"stages", "cli"}
MAY_IMPORT_DEV = {"eaglebox.cli", "eaglebox.engine.install"}
FORBIDDEN = {  # named explicitly, though the rules below imply them
    "capture": {"extract", "train", "bench", "serve", "stages"},
    "train": {"extract", "bench", "serve", "stages", "capture"},
}


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every module ``module`` imports, at any depth (lazy imports inside functions count)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in modules)
    return out


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the ``eaglebox``/``eaglebox_dev`` modules it imports, for every module under ``src``."""
    files = {_module_name(p, src): p for p in src.rglob("*.py") if p.parts[-2] != "__pycache__"}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        found = _imports(tree, name, path.name == "__init__.py", modules)
        graph[name] = {m for m in found if m.split(".")[0] in ("eaglebox", "eaglebox_dev")}
    return graph


def package(module: str) -> str:
    """``eaglebox.train.loop`` -> ``train``; ``eaglebox.errors`` -> ``errors``; ``eaglebox`` -> ``eaglebox``."""
    parts = module.split(".")
    if parts[0] != "eaglebox":
        return parts[0]
    return parts[1] if len(parts) > 1 else "eaglebox"


def package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Package -> imported package -> the module-level edges behind it (for the failure message)."""
    out: dict[str, dict[str, set[str]]] = {}
    for mod, deps in graph.items():
        if not mod.startswith("eaglebox.") and mod != "eaglebox":
            continue
        for dep in deps:
            a, b = package(mod), package(dep)
            if a != b:
                out.setdefault(a, {}).setdefault(b, set()).add(f"{mod} -> {dep}")
    return out


def cycles(pkgs: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in pkgs.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(pkgs) | {w for deps in pkgs.values() for w in deps}):
        if v not in index:
            visit(v)
    return found


def violations(graph: dict[str, set[str]]) -> list[str]:
    pkgs = package_graph(graph)
    unplaced = {package(m) for m in graph if m.split(".")[0] == "eaglebox"} - BASE - SHARED - WORKING - TOP
    bad = [f"{p}: not placed in a layer (add it to BASE, SHARED, WORKING or TOP)" for p in sorted(unplaced)]
    bad += [f"package cycle {' <-> '.join(c)}: " + "; ".join(sorted(e for a in c for b in c for e in
                                                                    pkgs.get(a, {}).get(b, ())))
           for c in cycles(pkgs)]
    for a, deps in sorted(pkgs.items()):
        if a in TOP:
            allowed = None
        elif a in WORKING:
            allowed = BASE | SHARED
        elif a in SHARED:
            allowed = BASE | SHARED
        else:  # base modules
            allowed = BASE
        for b, edges in sorted(deps.items()):
            if b == "eaglebox_dev":
                edges = {e for e in edges if e.split(" -> ")[0] not in MAY_IMPORT_DEV}
                if edges:
                    bad.append(f"{a} -> eaglebox_dev (test support): {sorted(edges)}")
            elif b in FORBIDDEN.get(a, ()) or (allowed is not None and b not in allowed):
                bad.append(f"{a} -> {b}: {sorted(edges)}")
    return bad


def test_every_package_imports_only_downwards():
    graph = import_graph()
    assert "eaglebox.capture.hook" in graph and "eaglebox.stages.check" in graph  # the walk found the tree
    assert violations(graph) == []


def test_the_rules_catch_a_cycle_and_a_sideways_import():
    graph = {"eaglebox.train.loop": {"eaglebox.draft.export", "eaglebox.extract.run"},
             "eaglebox.draft.export": {"eaglebox.train.model"}, "eaglebox.train.model": set(),
             "eaglebox.capture.hook": {"eaglebox.shards.spec", "eaglebox_dev.cpu_patches"},
             "eaglebox.extract.run": set(), "eaglebox.shards.spec": set()}
    found = violations(graph)
    assert any(v.startswith("package cycle draft <-> train") for v in found)
    assert "draft -> train: ['eaglebox.draft.export -> eaglebox.train.model']" in found
    assert "train -> extract: ['eaglebox.train.loop -> eaglebox.extract.run']" in found
    assert any(v.startswith("capture -> eaglebox_dev") for v in found)
    assert violations({"eaglebox.protocol.spec": set()}) == [
        "protocol: not placed in a layer (add it to BASE, SHARED, WORKING or TOP)"]
