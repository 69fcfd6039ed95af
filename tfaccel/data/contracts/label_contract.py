"""`check(dataset, model, loss)`: the labels against the model's output and the loss.

Shapes and dtypes are compared without reading data (the model's output shape is
read from a functional model, else from one symbolic call). One batch is read only
for value checks the shapes cannot make: float labels for a sparse loss (fractions,
NaN) and labels outside [0, 1] for a binary cross-entropy.
"""

from __future__ import annotations

import re
from typing import Any

import keras
import numpy as np
import tensorflow as tf

SPARSE, CATEGORICAL, BINARY, ELEMENTWISE = "sparse", "categorical", "binary", "elementwise"
_KINDS = {
    "sparse_categorical_crossentropy": SPARSE,
    "categorical_crossentropy": CATEGORICAL,
    "categorical_focal_crossentropy": CATEGORICAL,
    "categorical_hinge": CATEGORICAL,
    "kl_divergence": CATEGORICAL,
    "binary_crossentropy": BINARY,
    "binary_focal_crossentropy": BINARY,
    "hinge": BINARY,
    "squared_hinge": BINARY,
    "mean_squared_error": ELEMENTWISE,
    "mean_absolute_error": ELEMENTWISE,
    "mean_absolute_percentage_error": ELEMENTWISE,
    "mean_squared_logarithmic_error": ELEMENTWISE,
    "huber": ELEMENTWISE,
    "log_cosh": ELEMENTWISE,
    "poisson": ELEMENTWISE,
    "cosine_similarity": ELEMENTWISE,
}
_VOCABULARY = (
    "Map the strings to integers: data.from_csv(..., label_vocabulary=[...]) or a "
    "keras.layers.StringLookup in the input pipeline (preprocess=), then use "
    "sparse_categorical_crossentropy."
)


def check(dataset: tf.data.Dataset, model: keras.Model, loss: Any) -> None:
    """Raises ValueError when the labels do not fit the model's output and the loss.

    Args:
        dataset: a batched `tf.data.Dataset` of `(x, y[, sample_weight])`, or a
            dataset function (`tfaccel.data.pipeline(...)`'s result).
        model: the Keras model (built, or buildable by calling it on the features).
        loss: a loss name, a `keras.losses.Loss`, or a function `fn(y_true, y_pred)`.
            A custom function is called once on zeros of the two shapes instead of the
            kind checks.

    Raises:
        ValueError: naming the labels' and outputs' shapes, the loss and the fix.
    """
    if not isinstance(dataset, tf.data.Dataset) and callable(dataset):
        dataset = dataset(tf.distribute.InputContext())
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        return  # check_elements names this
    label = spec[1]
    if not isinstance(label, tf.TensorSpec) or not label.shape.rank:
        return  # several outputs (Keras matches them by name), or unbatched labels
    name, kind = loss_kind(loss)
    output = output_shape(model, spec[0])
    if label.dtype == tf.string:
        if kind is not None:
            raise ValueError(
                f"The labels are strings (shape {_shape(label.shape)}), but the loss {name!r} "
                f"needs numbers. {_VOCABULARY}"
            )
        return
    if output is not None:
        if kind is None:
            _try_loss(loss, name, label, output, dataset)
        else:
            _check_shapes(kind, name, label, output)
    if _reads_values(kind, name, label):
        _check_values(dataset, kind, name, output)


def loss_kind(loss: Any) -> tuple[str, str | None]:
    """The loss's name and what labels it takes (SPARSE, ..., or None when unknown)."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return loss, None
    fn = getattr(loss, "fn", loss) if isinstance(loss, keras.losses.Loss) else loss
    names = [getattr(fn, "__name__", None), getattr(loss, "name", None)]
    for candidate in names:
        if candidate in _KINDS:
            return candidate, _KINDS[candidate]
    return next((n for n in names if n), type(loss).__name__), None


def output_shape(model: keras.Model, x_spec: Any) -> tuple | None:
    """The model's (single) output shape, batch first; None when it has several or fails."""
    try:  # a functional model (or a built Sequential) knows them
        outputs = model.outputs
    except (AttributeError, ValueError):
        outputs = None
    if not outputs:
        symbolic = tf.nest.map_structure(
            lambda s: keras.KerasTensor(s.shape, dtype=s.dtype.name), x_spec
        )
        try:
            outputs = model(symbolic, training=False)
        except Exception:  # noqa: BLE001 - the feature checks and the first step report it
            return None
    flat = tf.nest.flatten(outputs)
    if len(flat) != 1 or flat[0].shape is None:
        return None
    return tuple(flat[0].shape)


def _dims(shape) -> tuple:
    return tuple(tf.TensorShape(shape).as_list())


def _shape(shape) -> str:
    dims = ["B", *("None" if d is None else str(d) for d in _dims(shape)[1:])]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _fits(have: tuple, want: tuple) -> bool:
    return len(have) == len(want) and all(
        h is None or w is None or h == w for h, w in zip(have, want, strict=True)
    )


def _same(label: tuple, output: tuple) -> bool:
    """Equal after the squeeze Keras applies to a trailing axis of size 1."""
    if _fits(label[1:], output[1:]):
        return True
    if len(label) == len(output) + 1 and label[-1] == 1:
        return _fits(label[1:-1], output[1:])
    if len(output) == len(label) + 1 and output[-1] == 1:
        return _fits(label[1:], output[1:-1])
    return False


def _check_shapes(kind: str, name: str, label_spec: tf.TensorSpec, output: tuple) -> None:
    label = _dims(label_spec.shape)
    output = _dims(output)
    pair = f"labels {_shape(label)} and model outputs {_shape(output)}"
    classes = output[-1] if len(output) > 1 else None
    indices = len(label) == len(output) - 1 or (len(label) == len(output) and label[-1] == 1)
    integer = label_spec.dtype.is_integer
    if kind == SPARSE:
        if len(label) == len(output) and classes not in (None, 1) and label[-1] == classes:
            raise ValueError(
                f"The loss {name!r} takes integer class indices, but {pair} look one-hot (one "
                "column per class). Use categorical_crossentropy for one-hot labels, or turn "
                "them into indices (tf.argmax(labels, axis=-1))."
            )
        if classes == 1:
            raise ValueError(
                f"The loss {name!r} needs one output per class, but the model has a single "
                f"output unit ({pair}). For two classes use binary_crossentropy with a sigmoid "
                "unit, or give the last layer one unit per class."
            )
        if not indices or not _same(label, output[:-1]):
            raise ValueError(
                f"The loss {name!r} takes one integer class index per example (labels (B,) "
                f"against outputs (B, classes)), but got {pair}. Give labels of shape "
                f"{_shape(output[:-1])}, or use a loss that fits these labels."
            )
        return
    if _same(label, output):
        if kind == CATEGORICAL and integer and classes is not None and label[-1] != classes:
            raise ValueError(_indices_message(name, pair, classes))
        return
    if kind == CATEGORICAL and (indices or integer) and classes is not None:
        raise ValueError(_indices_message(name, pair, classes))
    if kind == BINARY and indices and classes not in (None, 1):
        raise ValueError(
            f"The loss {name!r} compares each label with each output, but {pair}: one label "
            f"per example against {classes} outputs. For {classes} classes with integer "
            "labels use sparse_categorical_crossentropy; for one binary target give the last "
            f"layer 1 unit (sigmoid); for multi-label targets give labels {_shape(output)}."
        )
    broadcast = _broadcasts(label, output)
    hint = ""
    if integer and indices and classes not in (None, 1):
        hint = " Integer labels look like class indices: use sparse_categorical_crossentropy."
    if broadcast:
        raise ValueError(
            f"The loss {name!r} compares labels and outputs elementwise: labels "
            f"{_shape(label)} against outputs {_shape(output)} would broadcast (each label "
            f"against every output), training silently on the wrong target. Give labels of "
            f"the outputs' shape {_shape(output)}, or make the last layer output "
            f"{label[-1] if len(label) > 1 else 1} value(s).{hint}"
        )
    raise ValueError(
        f"The loss {name!r} needs labels of the outputs' shape, but got {pair}. Make the "
        f"labels {_shape(output)}, or the model's last layer output {_shape(label)}.{hint}"
    )


def _indices_message(name: str, pair: str, classes: int) -> str:
    return (
        f"The loss {name!r} takes one-hot labels of the outputs' shape, but {pair} look "
        "like integer class indices. Use sparse_categorical_crossentropy for integer "
        f"labels, or one-hot them (tf.one_hot(labels, {classes}))."
    )


def _broadcasts(label: tuple, output: tuple) -> bool:
    """Whether NumPy-style broadcasting would silently stretch one against the other."""
    if len(label) != len(output):
        return False
    return all(a == b or a == 1 or b == 1 for a, b in zip(label[1:], output[1:], strict=True))


def _try_loss(loss, name: str, label_spec: tf.TensorSpec, output: tuple, dataset) -> None:
    """Calls an unknown loss once on two real labels (zeros when there is no batch) and
    zero outputs of the model's shape."""
    label, output = _dims(label_spec.shape), _dims(output)
    if None in label[1:] or None in output[1:] or not callable(loss):
        return
    try:  # real labels: a valid loss may assert what its targets hold (e.g. positive)
        y_true = dataset.take(1).get_single_element()[1][:2]
    except tf.errors.InvalidArgumentError:
        y_true = tf.zeros((2, *label[1:]), label_spec.dtype)
    y_pred = tf.zeros((int(tf.shape(y_true)[0]), *output[1:]), tf.float32)
    try:
        loss(y_true, y_pred)
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
        text = getattr(error, "message", None) or str(error)
        first = re.sub(r"\{\{.*?\}\}|\s*\[Op:.*", "", text).strip().splitlines()[0][:300]
        raise ValueError(
            f"The loss {name!r} fails on labels {_shape(label)} and model outputs "
            f"{_shape(output)}: {first}. Make the labels fit the model's outputs (or the loss "
            "accept these shapes)."
        ) from error


def _reads_values(kind: str | None, name: str, label: tf.TensorSpec) -> bool:
    if kind == SPARSE:
        return label.dtype.is_floating
    return kind == BINARY and "crossentropy" in name


def _check_values(dataset: tf.data.Dataset, kind: str | None, name: str, output: Any) -> None:
    """Reads the first batch's labels (only) and names NaN, fractions or out-of-range values."""
    try:  # one op, no Python iterator: a few ms where `for element in ...` takes tens
        element = dataset.take(1).get_single_element()
    except tf.errors.InvalidArgumentError:
        return  # no batch: check_not_empty says so where it matters
    labels = np.asarray(element[1])
    if labels.dtype.kind == "f" and not np.isfinite(labels).all():
        bad = labels[~np.isfinite(labels)][0]
        raise ValueError(
            f"The labels of the first batch hold {bad} (not finite), so the loss {name!r} "
            "cannot use them. Fix or drop those rows (e.g. Dataset.filter), or impute the "
            "label; tfaccel.data.pipeline(check_finite=True) names each element with a "
            "non-finite feature or label."
        )
    if kind == SPARSE:
        fractional = labels[labels != np.round(labels)]
        if fractional.size:
            raise ValueError(
                f"The loss {name!r} takes integer class indices, but the labels hold "
                f"fractions (e.g. {float(fractional[0]):g}); it would truncate them to a "
                "class silently. Use integer class labels, or for soft/one-hot targets a "
                "non-sparse loss such as 'categorical_crossentropy'."
            )
    elif labels.size and (labels.min() < 0 or labels.max() > 1):
        bad = labels.max() if labels.max() > 1 else labels.min()
        classes = output[-1] if output and len(output) > 1 else None
        more = (
            "give the last layer one unit per class and use sparse_categorical_crossentropy"
            if classes == 1
            else "use sparse_categorical_crossentropy"
        )
        raise ValueError(
            f"The loss {name!r} takes targets in [0, 1], but the labels hold {bad:g}. For "
            f"more than two classes with integer labels {more}; for two classes, labels "
            "0 and 1."
        )
