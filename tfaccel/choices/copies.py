"""The model as the probes time it and the Trainer trains it: built on the input's spec,
copied under a dtype policy, with the global random states put back after.

A copy under a policy has the same weights (variables stay float32 under the mixed
policies) and computes in the policy's dtype, except the layers that give the model's
outputs: they compute in float32, so the loss does (as `tfaccel.models`' classifier).
From the user's model-building function, the function is called under the policy
instead (its own layers' dtypes win).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf


@contextlib.contextmanager
def global_policy(policy: str) -> Iterator[keras.DTypePolicy]:
    """Sets Keras's global dtype policy to `policy` (a concrete name) inside a `with`
    block and restores the previous one after (`tfaccel.precision.scope` resolves "auto"
    first)."""
    previous = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy(policy)
        yield keras.config.dtype_policy()
    finally:
        keras.config.set_dtype_policy(previous)


def build_symbolically(model: keras.Model, x_spec: Any) -> None:
    """Creates every variable before the optimizer is built, as `model.fit` does.

    Calling the model on symbolic inputs builds what `model.build(shape)` cannot: the
    sublayers of a subclassed model without a `build()` method (`build()` marks such a
    model built with no weights), created on first call.

    Raises:
        ValueError: the model cannot be called on `x_spec`; the message says what to do.
    """
    symbolic = tf.nest.map_structure(
        lambda s: keras.KerasTensor(s.shape, dtype=s.dtype.name), x_spec
    )
    try:
        model(symbolic)
    except Exception as error:  # noqa: BLE001 - re-raised with what to do
        raise ValueError(
            f"Could not build {type(model).__name__} on inputs {x_spec}: {error}. Build the "
            "model before training (call it once on a batch, or give it a build() method that "
            "creates its layers' weights)."
        ) from error


def under(
    model: keras.Model,
    policy: str,
    builder: Callable | None = None,
    strategy: tf.distribute.Strategy | None = None,
) -> keras.Model:
    """A copy of `model` computing under `policy`, with its weights: made in `strategy`'s
    scope with the global random states kept (None: the caller's scope and states).

    Raises:
        ValueError: the model cannot be copied (a subclassed model without a config and
            no builder); the message says what to pass instead.
    """
    if strategy is not None:
        with strategy.scope(), random_states_kept():
            return under(model, policy, builder)
    try:
        with global_policy(policy):
            if builder is not None:
                copy = builder()
            else:
                outputs = {id(t._keras_history[0]) for t in model.outputs}
                copy = keras.models.clone_model(
                    model, clone_function=lambda layer: _layer_under(layer, policy, outputs)
                )
        copy_weights(model, copy)
    except Exception as error:  # noqa: BLE001 - re-raised with what to do
        raise ValueError(
            f"The model could not be copied under the dtype policy {policy!r} "
            f"({type(error).__name__}: {error}). Pass a function that builds it, "
            "Trainer(build_model, precision=...), or build it under "
            "tfaccel.precision.scope(policy) yourself."
        ) from error
    return copy


def copy_weights(source: keras.Model, copy: keras.Model) -> None:
    """`copy.set_weights(source.get_weights())` without the round trip through NumPy: each
    variable is assigned the other's value (on a 16.8M-weight model 0.1-0.3 s became
    ~1 ms). Weights that do not pair up by count and shape go through `set_weights`, which
    says what differs."""
    pairs = list(zip(source.weights, copy.weights, strict=False))
    if len(source.weights) != len(copy.weights) or any(
        tuple(s.shape) != tuple(c.shape) for s, c in pairs
    ):
        copy.set_weights(source.get_weights())
        return
    for s, c in pairs:
        c.assign(s.value)


def _layer_under(layer, policy: str, outputs: set):
    config = layer.get_config()
    config["dtype"] = "float32" if id(layer) in outputs else policy
    try:
        return layer.__class__.from_config(config)
    except (TypeError, ValueError):  # a nested model: its own layers follow the global policy
        config.pop("dtype")
        return layer.__class__.from_config(config)


@contextlib.contextmanager
def random_states_kept() -> Iterator[None]:
    """Puts back Python's, NumPy's and TensorFlow's global random states on exit."""
    python, numpy_state = random.getstate(), np.random.get_state()
    generator = tf.random.get_global_generator()
    tf_state = generator.state.numpy()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        generator.reset(tf_state)
