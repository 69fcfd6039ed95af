"""Which of a pipeline's Python functions cannot run on a data-service worker.

cloudpickle sends a module by its name; a module object that is not the one its name
imports (autograph's `ag__`, held by a function defined inside a preprocess function that
`Dataset.map` converted) arrives as the plain module and fails on the worker at the first
element. Found here, in the training process, before step 1.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable
from typing import Any


def unshippable(functions: Iterable[Any]) -> list[str]:
    """The readable names of the functions (and those they call) that hold such a module."""
    found: list[str] = []
    seen: set[int] = set()
    stack = [f for f in functions if isinstance(f, types.FunctionType)]
    while stack:
        function = stack.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        values = [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
        values += [function.__globals__.get(n) for n in function.__code__.co_names]
        for value in values:
            if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is not value:
                name = _readable(function.__qualname__)
                if name not in found:
                    found.append(name)
            elif isinstance(value, types.FunctionType):
                stack.append(value)
    return found


def failing(functions: dict, round_trip: Callable[[dict], Any]) -> str:
    """The first function (by name) whose own `round_trip({token: function})` raises, and
    why; "" when each passes alone."""
    for token, function in functions.items():
        try:
            round_trip({token: function})
        except Exception as error:  # noqa: BLE001 - any failure is the answer
            name = _readable(getattr(function, "__qualname__", type(function).__name__))
            return f"{name}: {type(error).__name__}: {error}"
    return ""


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _readable(qualname: str) -> str:
    """`...tf__preprocess.<locals>.double` (autograph's wrappers) → `preprocess.<locals>.double`."""
    return qualname.rsplit("tf__", 1)[-1]


def message(names: list[str]) -> str:
    """Why the functions cannot be sent, and the fix."""
    shown = ", ".join(names)
    return (
        f"the pipeline's Python function(s) {shown} cannot be sent to the data-service "
        "workers: defined inside a function that Dataset.map converted with autograph, they "
        "hold autograph's private module, which a worker cannot import. Define them at module "
        "level (outside the preprocess function), or decorate the preprocess function with "
        "@tf.autograph.experimental.do_not_convert."
    )
