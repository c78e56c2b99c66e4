"""Run a function on a module right after it is first imported (in this process).

The way eaglebox patches SGLang: the patched names are replaced before any other SGLang module
can ``from X import name`` them, and nothing is imported early.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _PostImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one-shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(fullname)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.fn(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def on_import(name: str, fn: Callable) -> None:
    if name in sys.modules:
        fn(sys.modules[name])
    elif not any(isinstance(f, _PostImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImport(name, fn))
