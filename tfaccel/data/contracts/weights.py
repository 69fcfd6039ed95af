"""Sample weights against arrays: one weight per example, shaped as Keras accepts.

Both `data.from_arrays` and the Trainer's array inputs check with this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


def rows(x: Any) -> int:
    """The number of examples (rows) of an array structure."""
    return int(np.shape(tf.nest.flatten(x)[0])[0])


def check_sample_weight(x: Any, y: Any, weights: Any) -> None:
    """Raises ValueError unless `weights` has one row per example: shape (N,), (N, 1)
    or the labels' shape."""
    if weights is None or isinstance(weights, (dict, tuple)):
        return
    count, shape = rows(x), tuple(np.shape(weights))
    labels = tuple(np.shape(y)) if not isinstance(y, (dict, tuple)) else None
    if shape and shape[0] != count:
        raise ValueError(
            f"sample_weight has {shape[0]} rows but x has {count} examples; give one weight "
            "per example (shape (N,))."
        )
    if shape not in ((count,), (count, 1), labels):
        raise ValueError(
            f"sample_weight has shape {shape}, but the weights of {count} examples with "
            f"labels of shape {labels} take shape ({count},) (one weight per example) or the "
            "labels' shape. Reduce or reshape the weights."
        )
