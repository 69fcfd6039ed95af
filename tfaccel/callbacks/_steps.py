"""Step counting and small helpers shared by the callbacks."""

from __future__ import annotations

import os
import sys
import types
from typing import Any, Literal, overload

import keras
import numpy as np

MB = 1024.0 * 1024.0


@overload
def positive_int(name: str, value: Any, allow_none: Literal[False] = False) -> int: ...
@overload
def positive_int(name: str, value: Any, allow_none: bool) -> int | None: ...
def positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def share(name: str, value: Any) -> float:
    """`value` as a float strictly between 0 and 1 (a share of time), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}.")
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}.")
    return float(value)


def params_get(callback: keras.callbacks.Callback, key: str) -> Any:
    return (callback.params or {}).get(key)


def to_float(value: Any) -> float:
    return float(value.numpy() if hasattr(value, "numpy") else value)


def wait_for(logs: dict | None) -> None:
    """Blocks until a tensor in `logs` is computed (model.fit already passes floats)."""
    for value in (logs or {}).values():
        if hasattr(value, "numpy"):
            value.numpy()
            return


class StepClock:
    """Counts training steps across `on_train_batch_end` calls."""

    def __init__(self) -> None:
        self.steps = 0
        self._last_batch = -1

    def start_epoch(self) -> None:
        self._last_batch = -1

    def advance(self, batch: int, logs: dict | None, params: dict | None) -> int:
        """Returns the steps run since the previous call and adds them to `steps`."""
        explicit = None
        for key in ("steps", "num_steps"):
            if logs and logs.get(key) is not None:
                explicit = logs[key]
                break
        if explicit is not None:
            if isinstance(explicit, bool) or float(explicit) != int(explicit) or explicit < 1:
                raise ValueError(
                    f"logs['steps'] must be a positive integer (the steps run since the "
                    f"previous on_train_batch_end), got {explicit!r}."
                )
            count = int(explicit)
            self._last_batch = int(batch)
        else:
            last = int(batch)
            per_epoch = (params or {}).get("steps")
            if per_epoch:
                last = min(last, int(per_epoch) - 1)  # a final partial execution
            count = max(last - self._last_batch, 1)
            self._last_batch = last
        self.steps += count
        return count


_LIBRARY_DIRS = tuple(
    os.path.dirname(path) + os.sep
    for module in (keras, np)
    if (path := getattr(module, "__file__", None))
) + (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)


def user_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first frame outside tfaccel, Keras and TF.

    So a warning raised from a callback hook points at the user's `fit` call.
    """
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_LIBRARY_DIRS) and "/tensorflow/" not in name:
            return level
        frame, level = frame.f_back, level + 1
    return 1
