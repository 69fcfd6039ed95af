"""What to pass to `model.compile` and `model.fit` to train with methods (`for_fit`).

`for_fit(methods, model, dataset, epochs=..., loss=..., optimizer=...)` checks every
method against the job (before step 1), applies them in a fixed order (`composition`)
and returns a `MethodPlan`: the transformed dataset, the loss and optimizer to compile
with, the callbacks.

Example:
    >>> plan = methods.for_fit("fast", model, train, epochs=10,
    ...                        loss="sparse_categorical_crossentropy", optimizer=Adam())
    >>> model.compile(plan.optimizer, plan.loss, metrics=["accuracy"])
    >>> model.fit(plan.dataset, epochs=10, callbacks=plan.callbacks,
    ...           validation_data=plan.evaluation_data(val))          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.data import iterators
from tfaccel.methods.base import Job, MethodPlan, optimizer_object
from tfaccel.methods.batch_maps import transform
from tfaccel.methods.composition import MethodsArg, plan_for


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


def for_fit(
    methods: MethodsArg,
    model: keras.Model,
    dataset: Any,
    *,
    epochs: int,
    loss: Any,
    optimizer: Any = "adam",
    steps_per_epoch: int | None = None,
    batch_size: int | None = None,
    kind: str | None = None,
    seed: int | None = None,
) -> MethodPlan:
    """What to pass to `model.compile` and `model.fit` to train with `methods`.

    Args:
        methods: "fast", a method or a list of them (see `resolve`).
        model: the Keras model (built: its input and output shapes are read).
        dataset: the batched training dataset of `(x, y[, sample_weight])`, or a dataset
            function (`tfaccel.data.pipeline`'s result under a strategy).
        epochs: the job's epochs (the schedules and stages are sized to them).
        loss: the loss the user would compile with (a name or `keras.losses.Loss`).
        optimizer: the optimizer (object or name, not yet built).
        steps_per_epoch: steps per epoch (default: the dataset's length).
        batch_size: the global batch (default: the dataset's static batch, else the
            size of its first batch).
        kind: "image", "sequence" or "tabular" (default: from the features' rank).
        seed: the batch maps' seed (default 0: the draws also depend on each batch's
            content, so they vary with the shuffle and repeat in a resumed run).

    Returns:
        A `MethodPlan`: `.dataset`, `.loss`, `.optimizer`, `.callbacks`, `.evaluation_data(ds)`
        and `.describe()`. Pass validation and evaluation data through
        `plan.evaluation_data(...)`: a label method over a sparse loss makes the training
        labels one-hot, and the plan's loss refuses class ids (at the first validation,
        since `model.fit` reads `validation_data` only then). Its
        datasets free their iterators off `model.fit`'s thread (`data.freed_in_background`;
        the table's "input" row), even with no method.

    Raises:
        ValueError, TypeError: a method that cannot apply (each method's `check`), bad
            `epochs` or `steps_per_epoch`, a dataset of unknown length without
            `steps_per_epoch`, a method class instead of a method (`methods.MixUp`).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}.")
    spec = dataset.element_spec if isinstance(dataset, tf.data.Dataset) else None
    if spec is None:
        spec = dataset(None).element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise TypeError(f"The methods need batches of (x, y[, sample_weight]), got {spec}.")
    if batch_size is None:
        batch_size = _batch_of(dataset, spec)
    job = Job(
        model,
        loss,
        optimizer_object(optimizer),
        spec,
        epochs,
        steps_of(dataset, steps_per_epoch),
        batch_size,
    )
    plan = plan_for(methods, job, kind=kind, seed=seed)
    for regroup in plan.regroups:
        dataset = (
            regroup(dataset)
            if isinstance(dataset, tf.data.Dataset)
            else _regrouped(dataset, regroup)
        )
    plan.dataset = transform(dataset, plan.maps, plan.seed)
    if isinstance(plan.dataset, tf.data.Dataset):  # model.fit drops an iterator each epoch
        plan.dataset, plan.freed = iterators.freed_in_background(plan.dataset), True
    return plan
