"""`check_finite`: reject NaN / inf features and labels, naming the element that holds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data.elements import is_pair, is_weighted


def features_of(element: Any) -> Any:
    """The features of an element: the first item of a `(features, label)` pair or a
    `(features, label, sample_weight)` triple, else all."""
    return element[0] if is_pair(element) or is_weighted(element) else element


def assert_finite(index: Any, element: Any, where: str) -> Any:
    """Returns `element` unchanged, failing when a floating feature or label is NaN or inf.

    Raises (when the dataset is iterated):
        tf.errors.InvalidArgumentError: naming `where`, the element's index, and whether
            a feature or the label is not finite.
    """
    parts = [("feature", features_of(element))]
    if is_pair(element) or is_weighted(element):
        parts.append(("label", element[1]))
    if is_weighted(element):
        parts.append(("sample weight", element[2]))
    asserts = []
    for what, part in parts:
        floats = [t for t in tf.nest.flatten(part) if t.dtype.is_floating or t.dtype.is_complex]
        if not floats:
            continue
        finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in floats]))
        message = tf.strings.format(
            "tfaccel.data.pipeline(check_finite=True): element {} of " + where + " has a "
            f"non-finite {what} (NaN or inf). Expected finite {what}s; fix or drop that "
            f"element (e.g. Dataset.filter), or impute missing values in preprocess.",
            index,
        )
        asserts.append(tf.debugging.Assert(finite, [message]))
    if not asserts:
        return element
    with tf.control_dependencies(asserts):
        return tf.nest.map_structure(tf.identity, element)


def call(fn: Callable, element: Any, **kwargs: Any) -> Any:
    """Calls a `Dataset.map`-style function on one element (a tuple is unpacked)."""
    if isinstance(element, tuple):
        return fn(*element, **kwargs)
    return fn(element, **kwargs)


def checked(
    dataset: tf.data.Dataset, preprocess: Callable | None, *, deterministic: bool, where: str
) -> tf.data.Dataset:
    """Applies `preprocess` (may be None), then checks the features of each element.

    The index is the element's position in `dataset` (the source order), carried
    through a possibly non-deterministic parallel map.
    """
    indexed = dataset.enumerate()
    if preprocess is not None:
        indexed = indexed.map(
            lambda i, element: (i, call(preprocess, element)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
    return indexed.map(
        lambda i, element: assert_finite(i, element, where),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
