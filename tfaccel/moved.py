"""Old import paths, kept working for a while: each warns once, on import, with a
`DeprecationWarning` naming its new home, and hands on the same objects.

Two ways, one message: a module whose names now live in several modules keeps a file of
two lines (`forward`); a module or package that moved whole is an entry of `MODULES`,
found by the import system (`install`, from `tfaccel/__init__.py`) — the new module
itself, not a copy (an old package is a module of its own whose submodules are entries
too), so `from tfaccel.data.build.feed import Feed` is `tfaccel.data.Feed`'s class.
Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_ASSEMBLY = ("bench", "built", "cache", "feed", "pipeline", "plan", "sizing", "stages")
_CONTRACTS = ("finite", "label_contract", "weights")

MODULES: dict[str, str] = {
    "tfaccel.launch": "tfaccel.launcher.launch",
    "tfaccel.checks": "tfaccel.check.suite",
    "tfaccel.data.build": "tfaccel.data.assembly",
    "tfaccel.data.build.graph": "tfaccel.data.graph",
    **{f"tfaccel.data.build.{m}": f"tfaccel.data.assembly.{m}" for m in _ASSEMBLY},
    "tfaccel.data.checks": "tfaccel.data.contracts",
    **{f"tfaccel.data.checks.{m}": f"tfaccel.data.contracts.{m}" for m in _CONTRACTS},
}
"""Old module path -> its new home, for modules that moved whole."""


def _warn(old: str, new: Sequence[str], stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {' and '.join(new)}; import it from there ({old} will be removed).",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def forward(old: str, *new: str) -> Callable[[str], Any]:
    """Warns that `old` moved to `new` (its names now in these modules, the first named in
    the warning); returns the module `__getattr__` that reads them there."""
    _warn(old, new, stacklevel=3)
    modules = [importlib.import_module(name) for name in new]

    def __getattr__(name: str) -> Any:
        for module in modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"{old} has no {name!r} (it moved to {', '.join(new)})")

    return __getattr__


class _Alias(importlib.abc.Loader):
    """Loads an old path as its new module (warning that it moved)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: Any) -> ModuleType:
        _warn(self.old, (self.new,), stacklevel=3)  # warnings skips the import system's frames
        new = importlib.import_module(self.new)
        if not hasattr(new, "__path__"):
            return new  # a module: the very one
        return _package(self.old, new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is loaded already."""


def _package(old: str, new: ModuleType) -> ModuleType:
    """An old package's module: its submodules are `MODULES` entries (found as such), its
    other names those of `new`."""
    package = ModuleType(old, f"Moved to {new.__name__} (see `tfaccel.moved`).")
    package.__path__ = []  # a package: its submodules are looked up (and found first)

    def __getattr__(name: str) -> Any:
        if f"{old}.{name}" in MODULES:
            return importlib.import_module(f"{old}.{name}")
        return getattr(new, name)

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    return package


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the entries of `MODULES` before the file system does."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, new))


def install() -> None:
    """Puts the finder of moved modules first on `sys.meta_path` (once)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
