"""tfaccel: fast Keras training on one GPU today and many machines tomorrow.

The public API lives here; names not exported from this module are private.
Submodules load on first use. `import tfaccel` registers tfaccel's Keras layers and
models (so `keras.saving.load_model` finds them) — except inside the `tfaccel` command
(or `python -m tfaccel`), which answers `--help` and launches workers without importing
TensorFlow.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import sys as _sys
from typing import TYPE_CHECKING
from typing import Any as _Any

from tfaccel import moved as _moved
from tfaccel.launcher import forking as _forking

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"

# Public name -> the module that defines it (the errors: tfaccel.errors, without TensorFlow).
_NAMES = {
    "BottleneckBlock": "tfaccel.blocks",
    "InceptionBlock": "tfaccel.blocks",
    "ResidualBlock": "tfaccel.blocks",
    "DeviceConfigError": "tfaccel.errors",
    "CheckpointCorruptError": "tfaccel.errors",
    "CheckpointLockedError": "tfaccel.errors",
    "CheckpointMismatchError": "tfaccel.errors",
    "DroppedExamplesWarning": "tfaccel.errors",
    "Trainer": "tfaccel.train",
    "TrainingDivergedError": "tfaccel.errors",
}
_SUBMODULES = (
    "blocks",
    "callbacks",
    "check",
    "cluster",
    "data",
    "devices",
    "doctor",
    "errors",
    "methods",
    "models",
    "parallel",
    "precision",
    "tuning",
)
# Modules that register Keras serializable classes.
_REGISTERING = ("blocks", "parallel")

__all__ = [
    "BottleneckBlock",
    "CheckpointCorruptError",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "DeviceConfigError",
    "DroppedExamplesWarning",
    "InceptionBlock",
    "ResidualBlock",
    "Trainer",
    "TrainingDivergedError",
    "blocks",
    "callbacks",
    "check",
    "cluster",
    "data",
    "devices",
    "doctor",
    "errors",
    "methods",
    "models",
    "parallel",
    "precision",
    "tuning",
]

if TYPE_CHECKING:  # what static tools and IDEs see
    from tfaccel import (
        blocks,
        callbacks,
        check,
        cluster,
        data,
        devices,
        doctor,
        errors,
        methods,
        models,
        parallel,
        precision,
        tuning,
    )
    from tfaccel.blocks import BottleneckBlock, InceptionBlock, ResidualBlock
    from tfaccel.errors import (
        CheckpointCorruptError,
        CheckpointLockedError,
        CheckpointMismatchError,
        DeviceConfigError,
        DroppedExamplesWarning,
        TrainingDivergedError,
    )
    from tfaccel.train import Trainer


def __getattr__(name: str) -> _Any:  # a submodule or a name, imported on first use
    if name in _SUBMODULES:
        value = _importlib.import_module(f"tfaccel.{name}")
    elif name in _NAMES:
        value = getattr(_importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'tfaccel' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _is_command_line() -> bool:
    """True in the `tfaccel` command: the console script or `python -m tfaccel` (not a script)."""
    if _sys.argv and _os.path.basename(_sys.argv[0]) == "tfaccel":
        return True
    argv = list(getattr(_sys, "orig_argv", ()))
    return "-m" in argv and argv[argv.index("-m") + 1 :][:1] == ["tfaccel"]


if not _is_command_line():
    for _name in _REGISTERING:
        __getattr__(_name)

_forking.register()  # a child forked after TensorFlow started is told it may hang
_moved.install()  # old import paths warn and name their new home
