"""An optimizer's hyperparameters on resume: the ones the user passes now win.

A checkpoint restores the optimizer's *state* (step count, slots, loss scale). Keras
also keeps the learning rate as a variable beside that state, so a plain restore would
bring back the checkpoint's rate over the one the user just passed. `kept` undoes that
for every hyperparameter variable, and the run shape records `of(optimizer)` so a resume
can name what changed (`learning_rate: 0.01 in the checkpoint → 1e-05 now`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras

from tfaccel import strict_json

# Entries of `get_config()` that name the object rather than configure it.
_NOT_HYPERPARAMETERS = ("name",)


def _inner(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    return getattr(optimizer, "inner_optimizer", optimizer)


def _plain(value: object) -> bool | int | float | str | None:
    """A JSON value that compares equal across float32 round trips and schedules."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, (dict, list, tuple)):
        return strict_json.dumps(value, sort_keys=True, default=str)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def of(optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """The optimizer's hyperparameters as JSON values (looking through loss scaling).

    An optimizer whose `get_config` fails (a custom one without it) has none recorded:
    its changes are then not named on resume, and nothing else is affected.
    """
    try:
        config = dict(_inner(optimizer).get_config())
        if optimizer is not _inner(optimizer):
            outer = optimizer.get_config()
            config.update({k: v for k, v in outer.items() if k not in ("inner_optimizer", "name")})
    except (NotImplementedError, TypeError, ValueError, AttributeError):
        return {}
    return {k: _plain(v) for k, v in sorted(config.items()) if k not in _NOT_HYPERPARAMETERS}


def changes(saved: dict | None, now: dict) -> dict:
    """`{name: (in the checkpoint, now)}` for hyperparameters that differ."""
    if not saved:
        return {}
    return {k: (saved[k], now[k]) for k in now if k in saved and saved[k] != now[k]}


def describe(changed: dict) -> str:
    """`learning_rate: 0.01 in the checkpoint → 1e-05 now; ...`"""
    return "; ".join(f"{k}: {a} in the checkpoint → {b} now" for k, (a, b) in changed.items())


def _variables(optimizer: keras.optimizers.Optimizer) -> list[keras.Variable]:
    """The hyperparameters Keras keeps as variables (the learning rate unless a schedule)."""
    rate = getattr(_inner(optimizer), "_learning_rate", None)
    return [rate] if isinstance(rate, keras.Variable) else []


def variable_paths(optimizer: keras.optimizers.Optimizer | None) -> list[str]:
    """The paths of the hyperparameter variables (a checkpoint need not hold them)."""
    return [v.path for v in _variables(optimizer)]


@contextlib.contextmanager
def kept(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Whatever is restored inside the block, the optimizer keeps its hyperparameter values."""
    saved = [(v, v.numpy()) for v in _variables(optimizer)]
    try:
        yield
    finally:
        for variable, value in saved:
            variable.assign(value)
