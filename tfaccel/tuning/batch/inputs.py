"""Checks on the unbatched `(x, y)` data that the batch-size search batches itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data import graph


def _batched_by(dataset: tf.data.Dataset) -> int | None:
    """The batch size of a `.batch()` / `.padded_batch()` in the dataset's graph, if any.

    Returns -1 for a batching step whose size cannot be read, None for no batching.
    """
    return graph.batched_by(dataset)


def to_unbatched_dataset(data: Any, y: Any = None, *, what: str = "data") -> tf.data.Dataset:
    """An unbatched `tf.data.Dataset` of `(x, y)` (or `(x, y, sample_weight)`) examples.

    Args:
        data: an unbatched dataset of `(x, y)`, an `(x, y)` tuple of arrays, or `x` with `y`.
        y: labels when `data` holds only the inputs.
        what: the argument's name, for error messages.

    Raises:
        ValueError: a batched dataset, elements that are not `(x, y)`, arrays of
            different lengths.
        TypeError: something that is neither a dataset nor arrays.
    """
    if isinstance(data, tf.data.Dataset):
        if y is not None:
            raise ValueError(
                f"{what} is a tf.data.Dataset, so labels must be inside it; got y as well. "
                "Pass a dataset of (x, y) pairs and no y."
            )
        return check_unbatched(data, what)
    if y is not None:
        data = (data, y)
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        raise ValueError(
            f"{what} must be an unbatched tf.data.Dataset of (x, y) pairs or an (x, y) tuple "
            f"of arrays; got {type(data).__name__}. Pass (x_train, y_train)."
        )
    try:
        lengths = {len(part) for part in tf.nest.flatten(tuple(data))}
    except TypeError as error:
        raise TypeError(
            f"{what} must hold arrays with one example per row; got "
            f"{[type(p).__name__ for p in data]}. Pass numpy arrays (x, y)."
        ) from error
    if len(lengths) != 1:
        raise ValueError(
            f"The arrays in {what} have different lengths {sorted(lengths)}; x and y need "
            "one row per example."
        )
    if lengths == {0}:
        raise ValueError(f"{what} holds no examples.")
    arrays = tuple(tf.nest.map_structure(np.asarray, tuple(data)))
    return tf.data.Dataset.from_tensor_slices(arrays)


def check_unbatched(dataset: tf.data.Dataset, what: str = "data") -> tf.data.Dataset:
    """Returns `dataset` if its elements are single `(x, y)` examples, else raises ValueError."""
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            f"Each element of {what} must be an (x, y) pair (or (x, y, sample_weight)); got "
            f"element_spec {spec}. Map it first, e.g. ds.map(lambda d: (d['image'], d['label']))."
        )
    batch = _batched_by(dataset)
    leading = [s.shape[0] if s.shape.rank else 0 for s in tf.nest.flatten(spec)]
    if batch is not None or all(dim is None for dim in leading):
        shown = "" if batch in (None, -1) else f" with batch size {batch}"
        raise ValueError(
            f"{what} is already batched{shown} (element_spec {spec}). The batch-size search "
            "batches the data itself: pass it unbatched (drop the .batch(...) call, or "
            "call .unbatch() on it)."
        )
    return dataset


def count_examples(dataset: tf.data.Dataset) -> int | None:
    """The number of examples when the dataset's cardinality is known."""
    n = int(dataset.cardinality())
    return n if n >= 0 else None


def without_rewrites(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's default static optimizations and autotuning off, for the
    probes' pipelines.

    Those rewrites run at every new iterator and serialize the pipeline's graph, constants
    included: on data from in-memory arrays that costs each probe about 0.4 s per 600 MB
    (measured on a 2-core CPU), while the probes' small pipelines gain nothing from them.
    Each probe's `model.fit` also deletes its iterator at the end, which with autotuning on
    waits for tf.data's autotuning thread to wake (up to 2.5 s for a short fit; see
    `data/iterators.py`).
    """
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    return dataset.with_options(options)
