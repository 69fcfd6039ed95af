"""`from_arrays`: NumPy arrays or tensors sliced into `(features, label[, weight])` elements."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data import fingerprint
from tfaccel.data.contracts.weights import check_sample_weight
from tfaccel.data.sources.info import SourceInfo, attach_source


def from_arrays(x: Any, y: Any = None, sample_weight: Any = None) -> tf.data.Dataset:
    """Slices NumPy arrays or tensors into `(features, label)` elements.

    Args:
        x: an array, or a dict / tuple of arrays, sliced along the first axis.
        y: labels with the same first dimension, or None for features only.
        sample_weight: one weight per example (shape (N,) or (N, 1)) or per label
            element (the labels' shape), or None. Given, the elements are
            `(x[i], y[i], sample_weight[i])`; `pipeline` carries the weight through
            its stages beside each example (its functions still get `(features, label)`).

    Returns:
        An unbatched dataset of `(x[i], y[i])` (or `x[i]` when `y` is None, or
        `(x[i], y[i], sample_weight[i])` with weights).

    Raises:
        TypeError: `x` is None, or an array has dtype object and holds anything but
            strings (named, with the Python types it holds).
        ValueError: a scalar, a ragged (nested lists of unequal lengths) array,
            arrays that do not all have the same number of rows, weights without
            labels or not one per example.
    """
    if x is None:
        raise TypeError(
            "from_arrays: x is None; expected the features as an array (or a dict / tuple "
            "of arrays) with one row per example, e.g. from_arrays(x_train, y_train)."
        )
    parts = [("x", x), ("y", y), ("sample_weight", sample_weight)]
    lengths = {
        _rows(a, name)
        for part, leaf in parts
        if leaf is not None
        for name, a in _leaves(leaf, part)
    }
    if len(lengths) > 1:
        names, per = (
            ("x and y", "label")
            if sample_weight is None
            else ("x, y and sample_weight", "label and weight")
        )
        raise ValueError(
            f"from_arrays: {names} must have the same number of rows, got lengths "
            f"{sorted(lengths)}. Pass one {per} per example."
        )
    slices: Any  # the features, (x, y) or (x, y, sample_weight): one element's parts
    if sample_weight is not None:
        _check_weights(x, y, sample_weight)
        slices = (x, y, sample_weight)
    else:
        slices = x if y is None else (x, y)
    dataset = tf.data.Dataset.from_tensor_slices(slices)
    count = lengths.pop() if lengths else None
    digest = fingerprint.digest_arrays(slices)
    how = f"{count} rows' arrays (each over 8 MiB by evenly spaced rows)"
    details = {"elements": count} | ({"sample_weight": True} if sample_weight is not None else {})
    info = SourceInfo("arrays", details, count=count, identity=lambda: (digest, how))
    return attach_source(dataset, info)


def _check_weights(x: Any, y: Any, sample_weight: Any) -> None:
    """Raises ValueError for weights without labels or not one per example."""
    if y is None:
        raise ValueError(
            "from_arrays: sample_weight was given without labels y; weights go with "
            "(x, y) examples: from_arrays(x, y, sample_weight=w)."
        )

    try:
        check_sample_weight(x, y, sample_weight)
    except ValueError as error:
        raise ValueError(f"from_arrays: {error}") from None


def _leaves(structure: Any, name: str) -> list[tuple[str, Any]]:
    """`(name, array)` for each array of a `from_tensor_slices` structure (dicts and
    tuples nest; lists do not)."""
    if isinstance(structure, dict):
        return [leaf for k, v in structure.items() for leaf in _leaves(v, f"{name}[{k!r}]")]
    if isinstance(structure, tuple):
        return [leaf for i, v in enumerate(structure) for leaf in _leaves(v, f"{name}[{i}]")]
    return [(name, structure)]


def _rows(array: Any, name: str) -> int:
    """The number of rows of one array, with a clear error for scalars and ragged lists."""
    given = array
    if array is None:
        raise TypeError(
            f"from_arrays: {name} holds None; expected arrays with one row per example."
        )
    if not isinstance(array, (np.ndarray, tf.Tensor)) and not hasattr(array, "shape"):
        try:
            array = np.asarray(array)
        except ValueError as error:
            lengths = sorted({len(r) for r in array if hasattr(r, "__len__")})
            raise ValueError(
                f"from_arrays: {name} is ragged (rows of lengths {lengths[:10]}), so it is not "
                "an array. Pad the rows to one length (keras.utils.pad_sequences), or pass "
                f"a tf.RaggedTensor (tf.ragged.constant({name})). NumPy said: {error}"
            ) from None
    if getattr(getattr(array, "dtype", None), "kind", None) == "O":
        _check_objects(np.asarray(array), name)
    shape = np.shape(array)
    if not shape:
        raise ValueError(
            f"from_arrays: {name} is a scalar ({given!r}); expected an array whose first axis "
            "indexes the examples, e.g. shape (num_examples, ...)."
        )
    return int(shape[0])


def _check_objects(array: np.ndarray, name: str) -> None:
    """Raises TypeError for an object array that is not all strings (those read as text)."""
    kinds = sorted({type(v).__name__ for v in array.ravel()})
    if kinds and set(kinds) <= {"str", "bytes"}:
        return
    raise TypeError(
        f"from_arrays: {name} has dtype object (holding {', '.join(kinds[:5]) or 'nothing'}), "
        "which TensorFlow cannot slice. Convert it to a numeric dtype first, e.g. "
        f"{name}.astype('float32') (fill missing values before: pandas' fillna), or to "
        "strings with .astype(str)."
    )
