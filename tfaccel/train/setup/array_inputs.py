"""`model.fit`-style arguments for `Trainer.fit` / `evaluate`: arrays → `tfaccel.data` pipelines.

Supported as `model.fit` has them: `x` / `y` as NumPy arrays (or tensors, pandas
columns), a dict or tuple of arrays for several inputs, `batch_size` (default 32),
`validation_split` (the *last* fraction, taken before any shuffling, as Keras does),
`validation_data=(x_val, y_val[, sample_weight_val])`, `shuffle`, `class_weight`,
`sample_weight`, `validation_batch_size`. A dataset (or `tfaccel.data.pipeline`'s
result) passes through unchanged. What `model.fit` accepts and the Trainer does not is
refused with an error naming it (`REFUSED`).

The pipelines are `tfaccel.data.pipeline(from_arrays(...))`: sharded over the input
pipelines, shuffled each epoch with a seed drawn from NumPy's global generator (so
`keras.utils.set_random_seed(n)` fixes the order, as it does for `model.fit`),
batched keeping the partial last batch (as `model.fit` does; dropped only for XLA's
static shapes) and prefetched.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import tensorflow as tf

from tfaccel.data.assembly.feed import Feed
from tfaccel.data.assembly.pipeline import DatasetFn, pipeline
from tfaccel.data.contracts.weights import check_sample_weight
from tfaccel.data.contracts.weights import rows as _rows
from tfaccel.data.sources import from_arrays

DEFAULT_BATCH_SIZE = 32  # Keras' default for arrays

# Data the Trainer takes as it is: a dataset, a dataset function (`fn(input_context)`,
# or `DatasetFn`), a `Feed`.
Data: TypeAlias = "tf.data.Dataset | DatasetFn | Feed | Callable[..., tf.data.Dataset]"
# `model.fit`'s arrays: an array (NumPy, a tensor, a pandas column...), or a dict or
# tuple of them (several inputs).
Arrays: TypeAlias = "npt.ArrayLike | dict[str, npt.ArrayLike] | tuple[npt.ArrayLike, ...]"

# model.fit arguments the Trainer refuses, with what to do instead.
REFUSED = {
    "validation_freq": "validation runs after every epoch; pass validation_data only when "
    "you want it, or run trainer.evaluate(...) from a callback every N epochs",
}


def refuse(name: str, value: object) -> None:
    """Raises ValueError for a `model.fit` argument the Trainer does not support."""
    raise ValueError(
        f"Trainer.fit does not support {name}={value!r} (a model.fit argument): {REFUSED[name]}."
    )


def is_data(x: object) -> bool:
    """A dataset, a dataset function or a `Feed` (what the Trainer takes as it is)."""
    return isinstance(x, (tf.data.Dataset, DatasetFn, Feed)) or (
        callable(x) and not isinstance(x, (np.ndarray, tf.Tensor))
    )


def _check_arrays(x: object, what: str) -> Any:
    """`x` as arrays for `from_arrays`: lists of arrays become tuples, pandas → NumPy."""
    if x is None:
        return None
    if hasattr(x, "to_numpy") and not isinstance(x, (np.ndarray, tf.Tensor)):
        return x.to_numpy()
    if isinstance(x, dict):
        return {k: _check_arrays(v, f"{what}[{k!r}]") for k, v in x.items()}
    if isinstance(x, (list, tuple)) and x and all(hasattr(v, "shape") for v in x):
        return tuple(_check_arrays(v, f"{what}[{i}]") for i, v in enumerate(x))
    if isinstance(x, (np.ndarray, tf.Tensor, list, tuple)) or hasattr(x, "__array__"):
        return x
    kind = type(x).__name__
    raise TypeError(
        f"{what} is a {kind}; Trainer.fit takes NumPy arrays (or a dict of them), a "
        "tf.data.Dataset, or tfaccel.data.pipeline(...)'s result. For a Python generator or a "
        "keras.utils.PyDataset use tf.data.Dataset.from_generator(...).batch(n), or load the "
        "arrays."
    )


def _take(x: Arrays, start: int, stop: int | None) -> Arrays:
    return tf.nest.map_structure(lambda a: a[start:stop], x)


def split(
    arrays: tuple[Arrays | None, ...], validation_split: float
) -> tuple[tuple[Arrays | None, ...], tuple[Arrays | None, ...]]:
    """`(train, validation)` of a tuple of array structures: the last fraction validates.

    Raises:
        ValueError: a fraction outside (0, 1), or too few rows for both parts.
    """
    if isinstance(validation_split, bool) or not isinstance(validation_split, numbers.Real):
        raise ValueError(f"validation_split must be a number in [0, 1), got {validation_split!r}.")
    if not 0 < validation_split < 1:
        raise ValueError(
            f"validation_split must be in [0, 1) (the last fraction of the arrays becomes "
            f"validation data), got {validation_split!r}."
        )
    rows = _rows(arrays[0])
    cut = int(np.floor(rows * (1.0 - validation_split)))
    if cut in (0, rows):
        raise ValueError(
            f"validation_split={validation_split} of {rows} examples leaves "
            f"{'no training' if cut == 0 else 'no validation'} example. Use more data or "
            "another fraction."
        )
    train = tuple(None if a is None else _take(a, 0, cut) for a in arrays)
    val = tuple(None if a is None else _take(a, cut, None) for a in arrays)
    return train, val


def class_weights(y: Arrays, class_weight: dict[int, float]) -> np.ndarray:
    """Per-example weights from `{class: weight}` (classes absent from the dict weigh 1),
    reading integer labels, one-hot rows (their argmax) or (n, 1) labels, as `model.fit`.

    Raises:
        ValueError: `class_weight` is not a dict, or `y` is not one array.
    """
    if not isinstance(class_weight, dict):
        raise ValueError(
            f"class_weight must be a dict {{class index: weight}}, got {class_weight!r}."
        )
    if isinstance(y, (dict, tuple)):
        raise ValueError(
            "class_weight needs one label array; y holds several (several outputs). Pass "
            "sample_weight instead."
        )
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = labels.argmax(-1) if labels.shape[-1] != 1 else labels[..., 0]
    labels = np.round(labels).astype("int64")
    weights = np.ones(labels.shape[0], dtype="float32")
    for label, weight in class_weight.items():
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, numbers.Integral):
            raise ValueError(
                f"class_weight keys must be class indices (integers 0, 1, ...), got "
                f"{label!r} ({type(label).__name__}) in {class_weight!r}. Key the weights by "
                "the integer class, e.g. class_weight={0: 1.0, 1: 5.0}."
            )
        weights[labels == int(label)] = weight
    return weights


def to_pipeline(
    x: Arrays,
    y: Arrays | None,
    sample_weight: Arrays | None,
    *,
    batch_size: int,
    training: bool,
    shuffle: bool,
    strategy: tf.distribute.Strategy | None,
    jit_compile: bool,
) -> tf.data.Dataset | DatasetFn:
    """A `tfaccel.data.pipeline` over arrays (elements `(x, y)`, or `(x, y, sample_weight)`)."""
    if y is None:
        raise ValueError(
            "x is arrays but y is None: the Trainer needs labels. Pass y=..., or a dataset of "
            "(x, y) pairs as x (a model with its own train_step takes a batched dataset of "
            "any elements, e.g. tf.data.Dataset.from_tensor_slices(x).batch(32))."
        )
    source = from_arrays(x, y, sample_weight=sample_weight)
    seed = int(np.random.randint(0, 2**31 - 1)) if training and shuffle else None
    data = pipeline(
        source,
        batch_size=batch_size,
        training=training,
        shuffle_buffer="auto" if shuffle else None,
        seed=seed,
        deterministic=True,  # model.fit's order: batches in sequence, every run
        cache=None,  # the arrays are in memory already
        strategy=strategy,
        jit_compile=bool(jit_compile and training),
    )
    return data


def _check_batch_size(batch_size: object, name: str = "batch_size") -> int:
    if batch_size is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"{name} must be a positive integer (the global batch), got {batch_size!r}."
        )
    return batch_size


def _dataset_only(x: Data, **given: object) -> None:
    """Refuses array arguments next to a dataset, as `model.fit` does."""
    for name, value in given.items():
        unset = value is None or (isinstance(value, (bool, int, float)) and not value)
        if not unset:
            fix = {
                "y": "the labels come from the dataset's (x, y) elements",
                "batch_size": "the dataset is batched already (batch it with the global batch)",
                "sample_weight": "give elements (x, y, sample_weight)",
                "class_weight": "map the weights into the dataset as (x, y, sample_weight)",
                "validation_split": "pass validation_data=... (a dataset)",
            }[name]
            raise ValueError(
                f"{name}= is for arrays, but x is a {type(x).__name__}: {fix}. Remove {name}=."
            )


def training_data(
    x: Data | Arrays | None,
    y: Arrays | None,
    *,
    batch_size: int | None,
    validation_split: float,
    validation_data: Data | tuple[Arrays | None, ...] | None,
    validation_batch_size: int | None,
    shuffle: bool,
    class_weight: dict[int, float] | None,
    sample_weight: Arrays | None,
    strategy: tf.distribute.Strategy | None,
    jit_compile: bool,
) -> tuple[Data, Data | None]:
    """`(train_data, validation_data)` for `Trainer.fit` from `model.fit`-style arguments."""
    if shuffle not in (True, False):
        raise ValueError(
            f"shuffle must be True or False, got {shuffle!r} (shuffle='batch' is not "
            "supported: the pipeline shuffles examples)."
        )
    if x is None:
        raise ValueError("Trainer.fit needs training data: x (arrays or a dataset).")
    if is_data(x):
        _dataset_only(
            x,
            y=y,
            batch_size=batch_size,
            sample_weight=sample_weight,
            class_weight=class_weight,
            validation_split=validation_split,
        )
        train = x
    else:
        batch = _check_batch_size(batch_size)
        xs, ys = _check_arrays(x, "x"), _check_arrays(y, "y")
        weights = _check_arrays(sample_weight, "sample_weight")
        check_sample_weight(xs, ys, weights)
        if class_weight is not None and weights is not None:
            raise ValueError(
                "class_weight and sample_weight were both given; pass one (multiply the class "
                "weights into sample_weight to use both)."
            )
        if validation_split:
            if validation_data is not None:
                raise ValueError("validation_split and validation_data were both given; pass one.")
            (xs, ys, weights), validation_data = split((xs, ys, weights), validation_split)
            validation_batch_size = validation_batch_size or batch
        if class_weight is not None:
            weights = class_weights(ys, class_weight)
        train = to_pipeline(
            xs,
            ys,
            weights,
            batch_size=batch,
            training=True,
            shuffle=shuffle,
            strategy=strategy,
            jit_compile=jit_compile,
        )
        validation_batch_size = validation_batch_size or batch
    return train, evaluation_data(validation_data, validation_batch_size, strategy)


def evaluate_data(
    x: Data | Arrays | None,
    y: Arrays | None,
    batch_size: int | None,
    sample_weight: Arrays | None,
    strategy: tf.distribute.Strategy | None,
) -> Data | None:
    """`Trainer.evaluate`'s data: a dataset as it is, arrays (`x`, `y`, `sample_weight`)
    as a pipeline of `batch_size` (default 32).

    Raises:
        ValueError: `batch_size` with a dataset, or as `evaluation_data`.
    """
    if not is_data(x):
        x = (x, y) if sample_weight is None else (x, y, sample_weight)
        y = sample_weight = None
    elif batch_size is not None:
        raise ValueError("batch_size= is for arrays; the dataset is batched already.")
    return evaluation_data(x, batch_size, strategy, y, sample_weight)


def evaluation_data(
    data: Data | Arrays | tuple[Arrays | None, ...] | None,
    batch_size: int | None,
    strategy: tf.distribute.Strategy | None,
    y: Arrays | None = None,
    sample_weight: Arrays | None = None,
) -> Data | None:
    """A dataset as is, or arrays / an `(x, y[, sample_weight])` tuple as a pipeline."""
    if data is None or is_data(data):
        if data is not None:
            _dataset_only(data, y=y, sample_weight=sample_weight)
        return data
    if y is None and isinstance(data, tuple) and len(data) in (2, 3):
        x, y, *rest = data
        sample_weight = rest[0] if rest else None
    elif y is None:
        raise ValueError(
            f"validation_data must be a dataset or a tuple (x_val, y_val) or (x_val, y_val, "
            f"sample_weight_val), got {type(data).__name__}."
        )
    else:
        x = data
    x, y = _check_arrays(x, "x"), _check_arrays(y, "y")
    sample_weight = _check_arrays(sample_weight, "sample_weight")
    check_sample_weight(x, y, sample_weight)
    return to_pipeline(
        x,
        y,
        sample_weight,
        batch_size=_check_batch_size(batch_size, "validation_batch_size"),
        training=False,
        shuffle=False,
        strategy=strategy,
        jit_compile=False,
    )
