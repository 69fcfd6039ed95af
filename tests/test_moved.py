"""Old import paths warn naming their new home and hand on the very same objects."""

import importlib
import sys

import pytest

from tfaccel import moved


@pytest.mark.parametrize("old", sorted(moved.MODULES))
def test_a_moved_module_warns_and_is_its_new_home(monkeypatch, old):
    new = moved.MODULES[old]
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}; import it from there"):
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    if hasattr(target, "__path__"):  # an old package: its names are the new one's
        assert all(getattr(module, n) is getattr(target, n) for n in getattr(target, "__all__", []))
    else:
        assert module is target


def test_a_class_imported_by_its_old_path_is_the_same_class(monkeypatch):
    monkeypatch.delitem(sys.modules, "tfaccel.data.build", raising=False)
    monkeypatch.delitem(sys.modules, "tfaccel.data.build.feed", raising=False)
    with pytest.warns(DeprecationWarning):
        from tfaccel.data.build import graph
        from tfaccel.data.build.feed import Feed
    import tfaccel.data

    assert Feed is tfaccel.data.assembly.feed.Feed
    assert graph is importlib.import_module("tfaccel.data.graph")


def test_an_unknown_old_path_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tfaccel.no_such_module")
