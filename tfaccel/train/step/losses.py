"""Per-example losses, metric resolution and the loss scale read for the Trainer."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

import keras
import tensorflow as tf

# A Keras loss as `model.compile` takes it: an object, a name or a function.
LossSpec: TypeAlias = "keras.losses.Loss | str | Callable[..., Any]"
# One metric as `model.compile` takes it: an object, a name or a function.
MetricSpec: TypeAlias = "keras.metrics.Metric | str | Callable[..., Any]"
# `metrics=`: one metric alone, several, or None.
MetricsArg: TypeAlias = "MetricSpec | Iterable[MetricSpec] | None"


class PerExampleLoss:
    """Wraps a Keras loss (object, name or function) to return one value per example.

    `weight` multiplies it (a single-output model's `loss_weights`, as in `model.compile`).
    """

    def __init__(self, loss: LossSpec, weight: float = 1.0) -> None:
        if isinstance(loss, str):
            loss = keras.losses.get(loss)
        self.sums = False  # reduction="sum": the step's loss is the global batch's sum
        if isinstance(loss, keras.losses.Loss):
            self.sums = _sums(loss)
            loss = copy.copy(loss)
            loss.reduction = None
            self.name = loss.name
        elif callable(loss):
            self.name = getattr(loss, "__name__", type(loss).__name__)
        else:
            raise TypeError(f"loss must be a keras Loss, a loss name or a callable, got {loss!r}.")
        self.fn = loss
        self.weight = float(weight)

    def __call__(
        self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None
    ) -> tf.Tensor:
        """Returns a float32 vector with one loss per example of the batch."""
        if isinstance(self.fn, keras.losses.Loss):
            values = self.fn(y_true, y_pred, sample_weight)
        else:
            values = self.fn(*_same_rank(y_true, y_pred))
        values = tf.cast(values, tf.float32)
        if values.shape.rank == 0:
            raise ValueError(
                f"The loss {self.name!r} returned a scalar, so it cannot be reduced per "
                "example across replicas. Pass a keras.losses.Loss object or a function "
                "returning one value per example (shape [batch] or [batch, ...])."
            )
        if values.shape.rank is not None and values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        if sample_weight is not None and not isinstance(self.fn, keras.losses.Loss):
            weight = tf.cast(sample_weight, values.dtype)
            values *= tf.reshape(weight, [-1])
        if self.weight != 1.0:
            values *= self.weight
        return values


_MEAN = ("sum_over_batch_size", "mean", None, "none")


def _sums(loss: keras.losses.Loss) -> bool:
    """Whether the loss sums over the batch (else it is a mean); refuses what it cannot do."""
    reduction = getattr(loss, "reduction", "sum_over_batch_size")
    if reduction == "sum":
        return True
    if reduction in _MEAN:
        return False
    raise ValueError(
        f"The loss {loss.name!r} has reduction={reduction!r}, which the Trainer does not "
        "support: it reduces per-example losses over the global batch of all replicas, as "
        "a mean ('sum_over_batch_size', the default) or a sum ('sum'). Pass one of those."
    )


def _same_rank(y_true, y_pred):
    """Labels (B,) against outputs (B, 1), or the reverse, made one rank, as `model.fit`
    does for a loss function (a `keras.losses.Loss` does it itself)."""
    true_rank, pred_rank = y_true.shape.rank, y_pred.shape.rank
    if true_rank is None or pred_rank is None:
        return y_true, y_pred
    if pred_rank == true_rank + 1 and y_pred.shape[-1] == 1:
        y_true = tf.expand_dims(y_true, -1)
    elif true_rank == pred_rank + 1 and y_true.shape[-1] == 1:
        y_true = tf.squeeze(y_true, -1)
    return y_true, y_pred


_ACCURACY = {
    "sparse_categorical_crossentropy": keras.metrics.SparseCategoricalAccuracy,
    "binary_crossentropy": keras.metrics.BinaryAccuracy,
    "categorical_crossentropy": keras.metrics.CategoricalAccuracy,
}


def resolve_metrics(
    metrics: MetricsArg, loss: PerExampleLoss, weighted_metrics: MetricsArg = None
) -> list[keras.metrics.Metric]:
    """Turns metric objects, names and functions (one alone, a list, or None) into Keras
    `Metric` objects. As in `model.compile`, `metrics` ignore sample weights (and class
    weights) and `weighted_metrics` use them (`metric.tfaccel_weighted`)."""
    plain = _resolve(metrics, loss)
    weighted = _resolve(weighted_metrics, loss)
    for metric in plain:
        metric.tfaccel_weighted = False
    for metric in weighted:
        metric.tfaccel_weighted = True
    names = [m.name for m in plain + weighted]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"Two metrics are named {repeated}; the logs need one name each. Give one a name, "
            "e.g. keras.metrics.SparseCategoricalAccuracy(name='weighted_accuracy')."
        )
    return plain + weighted


def _resolve(metrics: MetricsArg, loss: PerExampleLoss) -> list[keras.metrics.Metric]:
    if metrics is None:
        metrics = []
    elif isinstance(metrics, (str, keras.metrics.Metric)) or callable(metrics):
        metrics = [metrics]
    resolved = []
    for metric in metrics:
        if isinstance(metric, keras.metrics.Metric):
            resolved.append(metric)
        elif metric in ("accuracy", "acc"):
            cls = _ACCURACY.get(loss.name, keras.metrics.SparseCategoricalAccuracy)
            resolved.append(cls(name="accuracy"))
        else:
            fn = keras.metrics.get(metric)
            if isinstance(fn, keras.metrics.Metric):
                resolved.append(fn)
            else:
                name = metric if isinstance(metric, str) else fn.__name__
                resolved.append(keras.metrics.MeanMetricWrapper(fn, name=name))
    return resolved


def loss_scale_of(optimizer: keras.optimizers.Optimizer) -> float | None:
    """The current dynamic loss scale, or None when the optimizer does not scale."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if optimizer.built:
            return float(optimizer.dynamic_scale.numpy())
        return float(optimizer.initial_scale)
    return None
