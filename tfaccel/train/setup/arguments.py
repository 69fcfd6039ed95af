"""Checks and resolves the Trainer's constructor and `fit` arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeAlias

import keras
import tensorflow as tf

from tfaccel import devices

# `Trainer(model)`: a model, or a zero-argument function building one.
ModelSpec: TypeAlias = "keras.Model | Callable[[], keras.Model]"
# `optimizer=`: an optimizer, its name, or a zero-argument function building one.
OptimizerSpec: TypeAlias = (
    "keras.optimizers.Optimizer | str | Callable[[], keras.optimizers.Optimizer]"
)
# `callbacks=`: one callback, several, or None (as Keras takes them).
CallbacksArg: TypeAlias = "keras.callbacks.Callback | Iterable[keras.callbacks.Callback] | None"


def build_model(model: ModelSpec) -> keras.Model:
    """Returns `model`, or calls it when it is a function building one (in scope).

    Raises:
        TypeError: `model` is neither a `keras.Model` nor a function returning one.
    """
    if isinstance(model, keras.Model):
        return model
    if not callable(model):
        raise TypeError(
            f"model must be a keras.Model or a zero-argument function that builds one, got "
            f"{model!r} ({type(model).__name__}). Pass e.g. Trainer(build_model, ...) with "
            "`def build_model(): return keras.Sequential([...])`."
        )
    built = model()
    if not isinstance(built, keras.Model):
        raise TypeError(
            f"The model function {getattr(model, '__name__', model)!r} returned "
            f"{type(built).__name__}, not a keras.Model. Make it return the model it builds."
        )
    return built


def build_optimizer(optimizer: OptimizerSpec) -> keras.optimizers.Optimizer:
    """Returns a Keras optimizer from an optimizer, its name, or a function building one.

    Raises:
        ValueError: an optimizer name Keras does not know.
        TypeError: anything else that does not give a Keras optimizer (e.g. a
            learning rate passed as the optimizer).
    """
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    if isinstance(optimizer, str):
        try:
            return keras.optimizers.get(optimizer)
        except ValueError:
            raise ValueError(
                f"Unknown optimizer name {optimizer!r}. Use a Keras name such as 'adam', "
                "'sgd', 'rmsprop' or 'adamw', or an optimizer, e.g. keras.optimizers.SGD(0.1)."
            ) from None
    hint = (
        f" To set the learning rate, pass e.g. optimizer=keras.optimizers.Adam({optimizer!r})."
        if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool)
        else ""
    )
    made = optimizer() if callable(optimizer) else optimizer
    if not isinstance(made, keras.optimizers.Optimizer):
        raise TypeError(
            f"optimizer must be a Keras optimizer, its name, or a function building one, got "
            f"{optimizer!r} ({type(optimizer).__name__}).{hint}"
        )
    return made


def callback_list(callbacks: CallbacksArg) -> list[keras.callbacks.Callback]:
    """Returns `callbacks` as a list, accepting None and a single callback as Keras does.

    Raises:
        TypeError: an item that is not a `keras.callbacks.Callback`.
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        return [callbacks]
    try:
        items = list(callbacks)
    except TypeError:
        items = [callbacks]
    for item in items:
        if not isinstance(item, keras.callbacks.Callback):
            raise TypeError(
                f"callbacks must be keras.callbacks.Callback objects, got {item!r} "
                f"({type(item).__name__}). Pass a Callback instance (e.g. Throughput(), with "
                "the parentheses), a list of them, or None."
            )
    return items


def check_steps(name: str, value: object) -> None:
    """Raises ValueError unless `value` is None or an integer >= 1.

    Args:
        name: the argument's name, for the message.
        value: a step count.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{name} must be an integer >= 1 (or None to run until the data ends), got {value!r}."
        )


def check_initial_epoch(value: object) -> None:
    """Raises ValueError unless `value` is an integer >= 0 (`fit(initial_epoch=...)`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"initial_epoch must be an integer >= 0 (the epoch to start counting at, as in "
            f"model.fit), got {value!r}."
        )


def default_strategy() -> tf.distribute.Strategy:
    """`tfaccel.devices.strategy("auto")`, for a Trainer given no strategy.

    Raises:
        RuntimeError: a multi-worker cluster is configured but TensorFlow already ran
            (the multi-worker strategy must exist before the first op); says what to do.
    """
    try:
        return devices.strategy("auto")
    except RuntimeError as error:
        if "Collective ops must be configured at program startup" not in str(error):
            raise
        raise RuntimeError(
            "This process is a worker of a multi-worker cluster (TF_CONFIG or Slurm), and "
            "TensorFlow ran before its multi-worker strategy was made, which TensorFlow "
            "refuses. Make the strategy first, at the top of the script: `strategy = "
            "tfaccel.devices.strategy()` before building the model, then "
            "Trainer(model, strategy=strategy)."
        ) from error
