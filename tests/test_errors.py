"""`tfaccel.errors` holds every exception and warning class of tfaccel; each is the same
class object at every path users import it from, and is documented."""

import ast
import importlib
import inspect
import pathlib

import pytest

from tfaccel import errors

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Where users import each class from (besides tfaccel.errors).
PATHS = {
    "CacheBusyWarning": ["tfaccel.data", "tfaccel.data.assembly.cache"],
    "CacheMismatchError": ["tfaccel.data", "tfaccel.data.assembly.cache"],
    "CacheMismatchWarning": ["tfaccel.data", "tfaccel.data.assembly.cache"],
    "StaleCacheWarning": ["tfaccel.data", "tfaccel.data.assembly.cache"],
    "ServiceError": ["tfaccel.data.service"],
    "PortInUseError": ["tfaccel.data.service", "tfaccel.data.service.server"],
    "CheckFailed": ["tfaccel.check", "tfaccel.check.suite"],
    "Skip": ["tfaccel.check", "tfaccel.check.suite"],
    "CheckpointCorruptError": ["tfaccel", "tfaccel.train", "tfaccel.train.state.checkpoint"],
    "CheckpointMismatchError": ["tfaccel", "tfaccel.train", "tfaccel.train.state.checkpoint"],
    "CheckpointLockedError": ["tfaccel", "tfaccel.train", "tfaccel.train.state.lock"],
    "TrainingDivergedError": ["tfaccel", "tfaccel.train", "tfaccel.train.loop.faults"],
    "DroppedExamplesWarning": ["tfaccel", "tfaccel.train", "tfaccel.train.setup.remainder"],
    "DeviceConfigError": ["tfaccel", "tfaccel.devices", "tfaccel.cluster"],
    "ClusterMismatchWarning": ["tfaccel.cluster"],
    "SlurmAllocationWarning": ["tfaccel.cluster"],
    "PeersMissingError": ["tfaccel.launcher.rendezvous"],
    "NoBatchSizeFitsError": ["tfaccel.tuning", "tfaccel.tuning.batch.search"],
    "LRScalingWarning": ["tfaccel.tuning.scaling"],
    "SplitError": ["tfaccel.parallel", "tfaccel.parallel.split"],
    "Untrusted": ["tfaccel.files.trusted"],
}


def test_every_class_is_listed_here_and_exported():
    assert sorted(errors.__all__) == sorted(PATHS)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, (Exception, Warning)), name
        assert cls.__module__ == "tfaccel.errors", name


@pytest.mark.parametrize("name", sorted(PATHS))
def test_the_same_class_at_every_import_path(name):
    for module in PATHS[name]:
        assert getattr(importlib.import_module(module), name) is getattr(errors, name), module


@pytest.mark.parametrize("name", sorted(PATHS))
def test_documented(name):
    cls = getattr(errors, name)
    assert cls.__doc__ and len(cls.__doc__.strip()) > 20, name


def _exception_classes(path: pathlib.Path):
    """Public classes of `path` whose bases name an exception or a warning."""
    known = set(PATHS) | {"Exception", "BaseException", "Warning", "UserWarning"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            if bases & known or any(b.endswith(("Error", "Warning")) for b in bases):
                yield node.name


def test_no_exception_class_is_defined_elsewhere():
    elsewhere = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "tfaccel").rglob("*.py"))
        if path.name != "errors.py"
        for name in _exception_classes(path)
    ]
    assert not elsewhere, "define these in tfaccel/errors.py:\n" + "\n".join(elsewhere)


def test_the_errors_module_imports_nothing():
    """Plain Python: catching a tfaccel error needs no TensorFlow of its own."""
    tree = ast.parse((ROOT / "tfaccel" / "errors.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations"]


def test_training_diverged_error_says_what_diverged():
    error = errors.TrainingDivergedError(12, 3, float("nan"))
    assert (error.step, error.variable) == (12, None)
    assert "the loss was nan for 3 consecutive step loops, up to step 12" in str(error)
    error = errors.TrainingDivergedError(5, variable="dense/kernel")
    assert "'dense/kernel' holds NaN or inf after step 5" in str(error)
    assert inspect.signature(errors.CheckFailed).parameters.keys() == {"message", "figure", "value"}
