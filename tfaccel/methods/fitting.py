"""What to pass to `model.compile` and `model.fit` to train with methods (`for_fit`).

`for_fit(methods, model, x, y, epochs=..., loss=..., optimizer=...)` takes what
`model.fit` takes (a batched `tf.data.Dataset`, a dataset function, or arrays with
`batch_size`, `sample_weight`, `validation_split` and `shuffle`), checks every method
against the job (before step 1), applies them in a fixed order (`composition`) and
returns a `FitPlan`: the training dataset, the validation data held out, the loss,
optimizer and metrics to compile with, the callbacks.

Example:
    >>> plan = methods.for_fit("fast", model, x, y, epochs=10, validation_split=0.1,
    ...                        loss="sparse_categorical_crossentropy", optimizer=Adam())
    >>> model.compile(plan.optimizer, plan.loss,
    ...               metrics=plan.metrics(["sparse_categorical_accuracy"]))
    >>> model.fit(plan.dataset, epochs=10, callbacks=plan.callbacks,
    ...           validation_data=plan.validation_data)              # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import keras
import numpy as np
import tensorflow as tf

from tfaccel.data import iterators
from tfaccel.methods.base import Job, MethodPlan, optimizer_object
from tfaccel.methods.batch_maps import transform
from tfaccel.methods.composition import MethodsArg, plan_for

if TYPE_CHECKING:
    from typing_extensions import Unpack

# model.fit's default batch for arrays.
KERAS_BATCH = 32


def steps_of(dataset: Any, steps_per_epoch: int | None) -> int:
    """Steps per epoch: given, or the dataset's finite length."""
    if steps_per_epoch is not None:
        if isinstance(steps_per_epoch, bool) or int(steps_per_epoch) < 1:
            raise ValueError(f"steps_per_epoch must be a positive int, got {steps_per_epoch!r}.")
        return int(steps_per_epoch)
    length = int(dataset.cardinality()) if isinstance(dataset, tf.data.Dataset) else -2
    if length < 1:
        raise ValueError(
            "The methods size their schedules to the job: pass steps_per_epoch= for a "
            "dataset of unknown or infinite length."
        )
    return length


def _batch_of(dataset: Any, spec: tuple) -> int | None:
    """The static batch of `spec`, else the first batch's size (one batch read)."""
    first = tf.nest.flatten(spec[0])[0].shape
    if first.rank and first[0] is not None:
        return int(first[0])
    if not isinstance(dataset, tf.data.Dataset) or not first.rank:
        return None
    for element in dataset.take(1):
        return int(tf.shape(tf.nest.flatten(element[0])[0])[0])
    return None


def _regrouped(
    dataset_fn: Callable[[Any], tf.data.Dataset],
    regroup: Callable[[tf.data.Dataset], tf.data.Dataset],
) -> Callable[[Any], tf.data.Dataset]:
    return lambda context: regroup(dataset_fn(context))


# A sparse metric -> its categorical twin, made from the sparse one's config (its name
# kept), for labels a method made one-hot. The Trainer maps its metric objects the same way.
TO_CATEGORICAL: dict[type, type] = {
    keras.metrics.SparseCategoricalAccuracy: keras.metrics.CategoricalAccuracy,
    keras.metrics.SparseTopKCategoricalAccuracy: keras.metrics.TopKCategoricalAccuracy,
    keras.metrics.SparseCategoricalCrossentropy: keras.metrics.CategoricalCrossentropy,
}
_SPARSE_NAMES = {  # what compile's strings and Keras' metric functions name
    "sparse_categorical_accuracy": keras.metrics.SparseCategoricalAccuracy,
    "sparse_top_k_categorical_accuracy": keras.metrics.SparseTopKCategoricalAccuracy,
    "sparse_categorical_crossentropy": keras.metrics.SparseCategoricalCrossentropy,
}
_SPARSE_CLASSES = {cls.__name__ for cls in TO_CATEGORICAL}


def categorical_metric(metric: Any) -> Any:
    """A sparse metric (object, `compile` string or Keras function) as its categorical
    twin under the same name; any other metric unchanged.

    Raises:
        ValueError: a sparse metric with `ignore_class` (one-hot labels cannot keep it).
    """
    if isinstance(metric, str) or callable(metric) and not isinstance(metric, keras.Metric):
        name = metric if isinstance(metric, str) else getattr(metric, "__name__", "")
        keras_own = isinstance(metric, str) or getattr(metric, "__module__", "").startswith("keras")
        if name not in _SPARSE_NAMES or not keras_own:
            return metric
        metric = _SPARSE_NAMES[name](name=name)
    twin = TO_CATEGORICAL.get(type(metric))
    if twin is None:
        return metric
    config = metric.get_config()
    ignored = config.pop("ignore_class", None)
    if ignored is not None:
        raise ValueError(
            f"The metric {metric.name!r} cannot keep ignore_class={ignored!r}: the methods "
            "made the labels one-hot, and Keras' categorical metrics have no ignore_class. "
            "Give those labels a sample weight of 0 (batches of (x, y, sample_weight)) and "
            "pass the metric as weighted_metrics instead, or leave the label method out."
        )
    return twin(**config)


def categorical_metrics(metrics: Any) -> Any:
    """`metrics` as `model.compile` takes them (a list, a dict per output, nested), each
    sparse metric made categorical by `categorical_metric`."""
    if isinstance(metrics, dict):
        return {key: categorical_metrics(value) for key, value in metrics.items()}
    if isinstance(metrics, list | tuple):
        return type(metrics)(categorical_metrics(value) for value in metrics)
    return categorical_metric(metrics)


def _sparse_names(config: Any) -> list[str]:
    """The sparse metrics named in a serialized compile config (`get_compile_config`)."""
    if isinstance(config, str):
        return [config] if config in _SPARSE_NAMES else []
    if isinstance(config, dict) and "class_name" in config:
        inner = config.get("config")
        named = config["class_name"] in _SPARSE_CLASSES or (
            isinstance(inner, str) and inner in _SPARSE_NAMES
        )
        return [str(inner.get("name") if isinstance(inner, dict) else inner)] if named else []
    values = config.values() if isinstance(config, dict) else config
    if isinstance(values, list | tuple) or isinstance(config, dict):
        return [name for value in values for name in _sparse_names(value)]
    return []


class SparseMetricsGuard(keras.callbacks.Callback):
    """Refuses, before step 1, a model compiled with a sparse loss or sparse metrics when
    the plan made the labels one-hot (they would fail at step 1 on a shape), naming the
    way out."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        config = self.model.get_compile_config() or {}
        if _sparse_names(config.get("loss")):
            raise ValueError(
                "The model is compiled with a sparse loss, but the methods made the labels "
                "one-hot: compile with loss=plan.loss (and optimizer=plan.optimizer)."
            )
        found = _sparse_names([config.get("metrics"), config.get("weighted_metrics")])
        if found:
            raise ValueError(
                f"The model is compiled with sparse metrics {found}, but the methods made the "
                "labels one-hot (a label method over a sparse loss): compile with "
                "metrics=plan.metrics([...]) (each keeps its name, computed on the one-hot "
                "labels) or metrics=['accuracy']."
            )


# The settings table's row when for_fit made the labels one-hot.
METRICS_NOTE = (
    "compile with metrics=plan.metrics([...]): sparse metrics become their categorical twins "
    "under their own names (compiled as given, they are refused before step 1)"
)


class FitPlan(MethodPlan):
    """`for_fit`'s plan: a `MethodPlan` with the validation data `validation_split` held
    out (`validation_data`, None without a split) and the metrics to compile with
    (`metrics(...)`)."""

    validation_data: Any = None

    def table(self) -> list[tuple[str, str]]:
        """`MethodPlan.table`, with a "metrics" row after "labels" when the labels were
        made one-hot: how to compile the metrics."""
        rows = super().table()
        at = next((i + 1 for i, (name, _) in enumerate(rows) if name == "labels"), None)
        return rows if at is None else [*rows[:at], ("metrics", METRICS_NOTE), *rows[at:]]

    def metrics(self, metrics: Any) -> Any:
        """The metrics to compile with: `metrics` as given, or, when the plan made the
        labels one-hot, each sparse metric as its categorical twin under its own name (the
        History keeps `sparse_categorical_accuracy`)."""
        return categorical_metrics(metrics) if self.one_hot else metrics


class FitOptions(TypedDict, total=False):
    """`for_fit`'s other keywords: `model.fit`'s `sample_weight` and `shuffle` (arrays
    only), the steps per epoch, the job's kind and the batch maps' seed."""

    sample_weight: Any
    shuffle: bool
    steps_per_epoch: int | None
    kind: str | None
    seed: int | None


def _is_dataset(x: Any) -> bool:
    """A `tf.data.Dataset` or a dataset function (not arrays)."""
    return isinstance(x, tf.data.Dataset) or callable(x) and not hasattr(x, "shape")


def _tensors(name: str, data: Any) -> Any:
    """`data`'s arrays as tensors, floats in Keras' float type (as `model.fit` casts)."""
    if data is None or isinstance(data, keras.utils.PyDataset) or hasattr(data, "__next__"):
        raise TypeError(
            f"for_fit takes {name} as model.fit does: a batched tf.data.Dataset, a dataset "
            f"function, or arrays (NumPy, tensors, a dict or list of them); got {type(data)}."
        )

    def tensor(leaf: Any) -> tf.Tensor:
        value = tf.convert_to_tensor(leaf if tf.is_tensor(leaf) else np.asarray(leaf))
        if value.dtype.is_floating and value.dtype.name != keras.config.floatx():
            value = tf.cast(value, keras.config.floatx())
        if value.shape.rank == 0:
            raise ValueError(f"{name} holds a scalar: give one row per example.")
        return value

    return tf.nest.map_structure(tensor, data)


def _count(name: str, data: Any, n: int | None) -> int:
    """The examples in `data` (every array's first axis), equal to `n` when given."""
    for leaf in tf.nest.flatten(data):
        if n is not None and int(leaf.shape[0]) != n:
            raise ValueError(
                f"{name} holds {int(leaf.shape[0])} examples where x holds {n}: give one "
                f"{'weight' if name == 'sample_weight' else 'row'} per example of x."
            )
        n = int(leaf.shape[0])
    assert n is not None
    return n


def _batches(data: tuple, size: int, shuffle: bool, seed: int | None) -> tf.data.Dataset:
    """`data` in batches of `size` (the last one partial), reshuffled each epoch."""
    n = int(tf.nest.flatten(data)[0].shape[0])
    order = tf.data.Dataset.range(n)
    if shuffle:
        order = order.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    gather = lambda index: tf.nest.map_structure(lambda t: tf.gather(t, index), data)  # noqa: E731
    return order.batch(size).map(gather, num_parallel_calls=tf.data.AUTOTUNE)


def _from_arrays(
    x: Any, y: Any, size: int, split: float, options: FitOptions
) -> tuple[tf.data.Dataset, tf.data.Dataset | None, int]:
    """The training batches, the held-out validation batches (the last `split` of the
    examples, before shuffling, as `model.fit` holds them out) and the training examples."""
    if y is None:
        raise ValueError(
            "for_fit was given arrays x without y: pass the labels, for_fit(methods, model, "
            "x, y, ...), as model.fit(x, y) (the methods read and change the labels)."
        )
    shuffle = options.get("shuffle", True)
    if not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be True or False with arrays, got {shuffle!r}.")
    data = [_tensors("x", x), _tensors("y", y)]
    n = _count("y", data[1], _count("x", data[0], None))
    if options.get("sample_weight") is not None:
        data.append(_tensors("sample_weight", options["sample_weight"]))
        _count("sample_weight", data[2], n)
    at = math.floor(n * (1.0 - split))
    if at in (0, n) and split:
        raise ValueError(
            f"validation_split={split} of {n} examples leaves no "
            f"{'training' if at == 0 else 'validation'} example: give more data or another "
            "validation_split."
        )
    train = tuple(tf.nest.map_structure(lambda t: t[:at], part) for part in data)
    seed = options.get("seed")
    batches = _batches(train, size, shuffle, seed)
    if not split:
        return batches, None, at
    held = tuple(tf.nest.map_structure(lambda t: t[at:], part) for part in data)
    return batches, _batches(held, size, False, None), at


def _inputs(
    x: Any, y: Any, batch_size: int | None, split: float, options: FitOptions
) -> tuple[Any, Any, int | None]:
    """(training data, held-out validation data or None, the batch) from `for_fit`'s
    inputs, refusing what `model.fit` refuses."""
    unknown = set(options) - set(FitOptions.__optional_keys__)
    if unknown:
        raise TypeError(
            f"for_fit got unexpected keyword arguments {sorted(unknown)}; it takes model.fit's "
            f"x, y, batch_size, validation_split, {', '.join(FitOptions.__optional_keys__)}."
        )
    if isinstance(split, bool) or not isinstance(split, int | float) or not 0 <= split < 1:
        raise ValueError(
            f"validation_split must be a fraction in [0, 1) (the last part of the examples "
            f"held out, as model.fit), got {split!r}."
        )
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    if not _is_dataset(x):
        size = KERAS_BATCH if batch_size is None else int(batch_size)
        train, held, examples = _from_arrays(x, y, size, float(split), options)
        return train, held, min(size, examples)
    given = [
        n for n, v in (("y", y), ("sample_weight", options.get("sample_weight"))) if v is not None
    ]
    if given or split:
        what = ", ".join(given + (["validation_split"] if split else []))
        raise ValueError(
            f"for_fit got {what} with a dataset: the dataset holds (x, y[, sample_weight]) "
            "already, and model.fit refuses a validation_split of a dataset too; split it "
            "yourself and pass validation_data=plan.evaluation_data(val)."
        )
    return x, None, batch_size


def for_fit(
    methods: MethodsArg,
    model: keras.Model,
    x: Any,
    y: Any = None,
    *,
    epochs: int,
    loss: Any,
    optimizer: Any = "adam",
    batch_size: int | None = None,
    validation_split: float = 0.0,
    **options: Unpack[FitOptions],
) -> FitPlan:
    """What to pass to `model.compile` and `model.fit` to train with `methods`.

    Args:
        methods: "fast", a method or a list of them (see `resolve`).
        model: the Keras model (built: its input and output shapes are read).
        x: what `model.fit` takes: the batched training dataset of `(x, y[,
            sample_weight])`, a dataset function (`tfaccel.data.pipeline`'s result under
            a strategy), or the features as arrays (NumPy, tensors, a dict or list of them).
        y: the labels, with arrays `x` (required then; not with a dataset).
        epochs: the job's epochs (the schedules and stages are sized to them).
        loss: the loss the user would compile with (a name or `keras.losses.Loss`).
        optimizer: the optimizer (object or name, not yet built).
        batch_size: the global batch: with arrays, the batch they are cut in (default 32,
            as `model.fit`); with a dataset, its batch if the methods should read another
            (default: its static batch, else the size of its first batch).
        validation_split: with arrays, the fraction of the examples held out for
            validation: the last ones, before shuffling, as `model.fit`
            (`plan.validation_data`).
        **options: `sample_weight` (arrays: one weight per example), `shuffle` (arrays:
            reshuffled each epoch, default True), `steps_per_epoch` (default: the data's
            length), `kind` ("image", "sequence" or "tabular"; default: read from the
            model, else the features' rank: `kind_of`), `seed` (the batch maps' and the
            shuffle's; default 0 for the maps, whose draws also depend on each batch's
            content, and an unseeded shuffle).

    Returns:
        A `FitPlan`: `.dataset`, `.validation_data`, `.loss`, `.optimizer`,
        `.metrics(...)`, `.callbacks`, `.evaluation_data(ds)` and `.describe()`. A label
        method over a sparse loss makes the training labels one-hot: compile with
        `metrics=plan.metrics([...])` (sparse metrics become their categorical twins under
        their own names; `plan.callbacks` refuses sparse ones before step 1) and pass other
        validation or evaluation data through `plan.evaluation_data(...)` (the plan's loss
        refuses class ids). Its datasets free their iterators off `model.fit`'s thread
        (`data.freed_in_background`; the table's "input" row), even with no method.

    Raises:
        ValueError, TypeError: a method that cannot apply (each method's `check`), bad
            `epochs`, `steps_per_epoch`, `batch_size` or `validation_split`, arrays without
            `y`, `y`, `sample_weight` or `validation_split` with a dataset (as `model.fit`),
            arrays of different lengths, a dataset of unknown length without
            `steps_per_epoch`, a method class instead of a method (`methods.MixUp`).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}.")
    dataset, held, batch_size = _inputs(x, y, batch_size, validation_split, options)
    spec = dataset.element_spec if isinstance(dataset, tf.data.Dataset) else None
    if spec is None:
        spec = dataset(None).element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise TypeError(f"The methods need batches of (x, y[, sample_weight]), got {spec}.")
    if batch_size is None:
        batch_size = _batch_of(dataset, spec)
    steps = steps_of(dataset, options.get("steps_per_epoch"))
    job = Job(model, loss, optimizer_object(optimizer), spec, epochs, steps, batch_size)
    probed = dataset if isinstance(dataset, tf.data.Dataset) else None  # "auto"'s probes
    kind, seed = options.get("kind"), options.get("seed")
    plan = _fit_plan(plan_for(methods, job, kind=kind, seed=seed, data=probed))
    for regroup in plan.regroups:
        dataset = (
            regroup(dataset)
            if isinstance(dataset, tf.data.Dataset)
            else _regrouped(dataset, regroup)
        )
    plan.dataset = transform(dataset, plan.maps, plan.seed)
    if isinstance(plan.dataset, tf.data.Dataset):  # model.fit drops an iterator each epoch
        plan.dataset, plan.freed = iterators.freed_in_background(plan.dataset), True
    if held is not None:
        plan.validation_data = plan.evaluation_data(held)
    if plan.one_hot:
        plan.callbacks.append(SparseMetricsGuard())
    return plan


def _fit_plan(plan: MethodPlan) -> FitPlan:
    """`plan` as a `FitPlan` (the same object: the methods' callbacks hold it)."""
    plan.__class__ = FitPlan
    assert isinstance(plan, FitPlan)
    return plan
