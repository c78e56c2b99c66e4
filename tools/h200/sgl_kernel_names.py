"""Write the names each module of the real sglang-kernel wheel defines (``{module: [names]}``), for the
stand-in in ``sgl_kernel/``: python sgl_kernel_names.py WHEEL OUT.json. Read with ast: nothing runs."""

import ast
import json
import sys
import zipfile


def defined(tree: ast.Module) -> tuple[set[str], list[str]]:
    """Top-level names (in if/try blocks too) and the modules star-imported."""
    names, stars = set(), []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    stars.append(node.module)
                else:
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return names, stars


def main(wheel: str, out: str) -> None:
    z = zipfile.ZipFile(wheel)
    modules = {}
    for path in z.namelist():
        if path.startswith("sgl_kernel/") and path.endswith(".py"):
            name = path[:-3].replace("/", ".").removesuffix(".__init__")
            modules[name] = defined(ast.parse(z.read(path)))
    resolved = {}

    def names_of(module: str, seen=()) -> set[str]:
        own, stars = modules.get(module, (set(), []))
        out = set(own)
        for star in stars:
            if star not in seen:
                out |= {n for n in names_of(star, (*seen, module)) if not n.startswith("_")}
        return out
    for module in modules:
        resolved[module] = sorted(names_of(module))
    with open(out, "w") as f:
        json.dump(resolved, f, indent=0, sort_keys=True)
    print(f"{out}: {len(resolved)} modules, {len(resolved['sgl_kernel'])} names in sgl_kernel")


if __name__ == "__main__":
    main(*sys.argv[1:])
