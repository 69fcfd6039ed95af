"""Per-example losses and metric resolution for the Trainer."""

from __future__ import annotations

import copy

import keras
import tensorflow as tf


class PerExampleLoss:
    """Wraps a Keras loss (object, name or function) to return one value per example."""

    def __init__(self, loss):
        if isinstance(loss, str):
            loss = keras.losses.get(loss)
        if isinstance(loss, keras.losses.Loss):
            loss = copy.copy(loss)
            loss.reduction = None
            self.name = loss.name
        elif callable(loss):
            self.name = getattr(loss, "__name__", type(loss).__name__)
        else:
            raise TypeError(f"loss must be a keras Loss, a loss name or a callable, got {loss!r}.")
        self.fn = loss

    def __call__(self, y_true, y_pred, sample_weight=None) -> tf.Tensor:
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
        return values


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


def resolve_metrics(metrics, loss: PerExampleLoss) -> list[keras.metrics.Metric]:
    """Turns metric objects, names and functions (one alone, a list, or None) into Keras
    `Metric` objects."""
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
