"""The range test reads finite inputs only: a NaN or inf in its features or labels is
named, and no rate suggested, whatever the loss does.

The loss alone cannot tell: a NaN feature can leave a fused Dense + ReLU as a finite 0,
so the loss stays finite and the curve bends with a normal-looking reason. Arrays are
checked before anything runs (`check_arrays`: every row); a `tf.data.Dataset` is checked
batch by batch as the test reads it (`checked`, with `data.contracts.finite`), and the
failure is raised as a `ValueError` naming the batch (`named`). A Python generator or a
`PyDataset` is not read ahead: there only the loss tells (`nonfinite`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data.contracts import finite

WHERE = "the data of the range test (find_learning_rate)"
CHUNK = 1 << 22  # array elements checked at once
FIX = (
    "A NaN feature can pass a ReLU as a finite output, so the loss alone would not show "
    "it and the suggestion would be wrong: no rate is suggested from such data. Fix or "
    "drop those rows (or impute the missing values) and run the test again; "
    "tfaccel.data.pipeline(..., check_finite=True) names them as training reads them."
)


def checked(data: Any, y: Any = None) -> Any:
    """`data` with its inputs checked: arrays (with `y`) now, a dataset as it is read.

    Raises:
        ValueError: an array of features or labels holds NaN or inf (its rows named).
    """
    if isinstance(data, tf.data.Dataset):
        leaves = tf.nest.flatten(data.element_spec)
        if not all(isinstance(spec, tf.TensorSpec) for spec in leaves):
            return data  # ragged or sparse parts: left to the loss
        return data.enumerate().map(
            lambda index, element: finite.assert_finite(index, element, WHERE),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    if y is not None:
        check_arrays(data, y)
    return data


def check_arrays(x: Any, y: Any) -> None:
    """Raises ValueError naming the rows of the floating arrays of `x` or `y` that hold
    NaN or inf (how many, and the first)."""
    for what, name, part in (("features", "x", x), ("labels", "y", y)):
        for path, leaf in _leaves(part):
            try:
                array = np.asarray(leaf)
            except (TypeError, ValueError):
                continue
            if array.dtype.kind not in "fc" or array.size == 0:
                continue
            bad = _bad_rows(array)
            if bad:
                where = name + "".join(f"[{key!r}]" for key in path)
                rows = len(array) if array.ndim else 1
                raise ValueError(
                    f"find_learning_rate: {bad[0]} of {rows} rows of the {what} ({where}) hold "
                    f"NaN or inf (the first: row {bad[1]}). {FIX}"
                )


def _leaves(part: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """`(path, array)` of each array in nested dicts, lists and tuples."""
    if isinstance(part, dict):
        return [leaf for key, value in part.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(part, list | tuple):
        return [leaf for i, value in enumerate(part) for leaf in _leaves(value, (*path, i))]
    return [(path, part)]


def _bad_rows(array: np.ndarray) -> tuple[int, int] | None:
    """(how many rows hold a non-finite value, the first of them), or None."""
    if array.ndim == 0:
        return None if np.isfinite(array) else (1, 0)
    step = max(1, CHUNK // max(1, array[0].size))
    count, first = 0, None
    for start in range(0, len(array), step):
        chunk = array[start : start + step]
        bad = ~np.isfinite(chunk).reshape(len(chunk), -1).all(axis=1)
        if bad.any():
            count += int(bad.sum())
            first = start + int(np.argmax(bad)) if first is None else first
    return None if first is None else (count, first)  # first is set with the first bad row


@contextlib.contextmanager
def named() -> Iterator[None]:
    """Raises the failure of a batch `checked` read as a ValueError naming the batch."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        found = re.search(
            r"element (\d+) of " + re.escape(WHERE) + r" has a non-finite ([a-z ]+?) \(",
            str(error),
        )
        if found is None:
            raise
        batch, what = found.groups()
        raise ValueError(
            f"find_learning_rate: batch {batch} of the data (counted from 0) holds a "
            f"non-finite {what} (NaN or inf), so the range test stopped there (the state "
            f"it trained is put back). {FIX}"
        ) from None
