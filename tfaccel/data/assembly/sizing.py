"""How big a shuffle buffer may be: element size × buffer ≤ a memory budget.

The "auto" rule: `buffer = min(budget_bytes // element_bytes, cardinality)`, at
least 1, where

* `budget_bytes` is `shuffle_budget_mb` MiB per input pipeline
  (default `SHUFFLE_BUDGET_MB` = 512 MiB), the memory the buffer may hold;
* `element_bytes` is the size of one element at the shuffle step, from its
  `element_spec` when every shape is static, otherwise measured on one real
  element (strings, ragged shapes); `UNKNOWN_ELEMENT_BYTES` (1 MiB) when no
  element can be read eagerly;
* `cardinality` is the number of elements when tf.data knows it (so a small
  dataset is shuffled completely, a large one never "blindly whole").

An explicit integer buffer whose `buffer × element_bytes` exceeds the budget is
an error rather than a silent out-of-memory later.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

SHUFFLE_BUDGET_MB = 512
"""Memory for `shuffle_buffer="auto"`: min(this ÷ element bytes, dataset size) elements."""
UNKNOWN_ELEMENT_BYTES = 1 << 20
_MIB = 1 << 20


def static_element_bytes(element_spec: Any) -> int | None:
    """Bytes of one element from its spec, or None when a shape or size is not static."""
    total = 0
    for spec in tf.nest.flatten(element_spec):
        if not isinstance(spec, tf.TensorSpec) or spec.dtype == tf.string:
            return None
        if not spec.shape.is_fully_defined():
            return None
        total += int(np.prod(spec.shape.as_list(), dtype=np.int64)) * spec.dtype.size
    return total


def measured_element_bytes(dataset: tf.data.Dataset) -> int | None:
    """Bytes of the first element of `dataset` (None when not eager or empty)."""
    if not tf.executing_eagerly():
        return None
    for element in dataset.take(1):
        total = 0
        for value in tf.nest.flatten(element, expand_composites=True):
            array = np.asarray(value.numpy())
            if array.dtype == object:
                total += sum(len(v) for v in np.ravel(array))
            else:
                total += array.nbytes
        return max(total, 1)
    return None


def known_cardinality(dataset: tf.data.Dataset) -> int | None:
    """The number of elements when finite and known, else None."""
    value = tf.get_static_value(dataset.cardinality())
    if value is None or value < 0:
        return None
    return int(value)


def check_request(requested: Any) -> None:
    """Raises ValueError unless `requested` is "auto", None or a positive int."""
    if requested is None or requested == "auto":
        return
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(
            f"shuffle_buffer must be 'auto', None (no shuffle) or a positive int, got "
            f"{requested!r}."
        )


def shuffle_buffer_size(
    requested: int | str | None,
    *,
    element_bytes: int,
    cardinality: int | None,
    budget_mb: float,
) -> tuple[int, str]:
    """Resolves a shuffle buffer size and says why.

    Args:
        requested: "auto" or a positive int.
        element_bytes: bytes per element at the shuffle step.
        cardinality: elements in the dataset, or None if unknown / infinite.
        budget_mb: memory the buffer may use, in MiB.

    Returns:
        `(buffer, reason)`.

    Raises:
        ValueError: a non-positive or unknown request, or an int buffer that
            exceeds the budget.
    """
    fits = max(int(budget_mb * _MIB) // max(element_bytes, 1), 1)
    if requested == "auto":
        size = fits if cardinality is None else max(min(fits, cardinality), 1)
        reason = f"auto: {budget_mb:g} MiB budget / {element_bytes:,} B per element = {fits:,}" + (
            "" if cardinality is None else f", capped at {cardinality:,} elements"
        )
        return size, reason
    check_request(requested)
    if not isinstance(requested, int):  # None: no shuffle, no buffer to size
        raise TypeError(f"shuffle_buffer_size needs 'auto' or a positive int, got {requested!r}.")
    if requested > fits:
        need = requested * element_bytes / _MIB
        raise ValueError(
            f"shuffle_buffer={requested:,} needs {need:,.0f} MiB ({element_bytes:,} B per "
            f"element), more than the {budget_mb:g} MiB shuffle memory budget (at most "
            f"{fits:,} elements fit). Use shuffle_buffer='auto', a smaller buffer, or raise "
            "shuffle_budget_mb."
        )
    return requested, "explicit"
