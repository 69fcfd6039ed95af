"""The state a diagnosis touches, saved before and put back after."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf


def _tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras variable (itself for a tf.Variable)."""
    value = getattr(variable, "value", None)
    return value if isinstance(value, tf.Variable) else variable


class Snapshot:
    """The values of `variables`, per replica, to `restore` later.

    Each component of a distributed variable (a mirrored copy per device, or a
    per-replica part of a sync-on-read variable) is saved and restored as it is, so
    nothing is averaged or summed on the way back.

    Args:
        strategy: the strategy the variables were made under.
        variables: Keras or TensorFlow variables (duplicates are saved once).
    """

    def __init__(self, strategy: tf.distribute.Strategy, variables: Iterable[Any]) -> None:
        self.strategy = strategy
        self._saved: list[list[tuple[Any, Any]]] = []
        seen: set[int] = set()
        for variable in variables:
            tf_var = _tf_variable(variable)
            if id(tf_var) in seen:
                continue
            seen.add(id(tf_var))
            parts = strategy.experimental_local_results(tf_var)
            self._saved.append([(part, part.numpy()) for part in parts])

    def __len__(self) -> int:
        return len(self._saved)

    def restore(self) -> None:
        """Puts every saved value back."""
        for parts in self._saved:
            for part, value in parts:
                part.assign(value)
