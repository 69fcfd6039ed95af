"""Keeps BatchNormalization's moving statistics equal on every replica and worker.

In Keras 3 each replica of a `MirroredStrategy` / `MultiWorkerMirroredStrategy`
updates BatchNormalization's `moving_mean` / `moving_variance` from its own slice of
the batch, and the copies drift apart: replicas then evaluate differently and
workers end with different weights. Averaging the copies is exact for the mean
(the moving average is linear, so averaging once per call equals averaging every
step) and a close estimate for the variance, and costs one all-reduce per call —
unlike `BatchNormalization(synchronized=True)`, which all-reduces every layer's
batch statistics at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf


def moving_statistics(model: keras.Model) -> list:
    """The moving mean / variance variables of every BatchNormalization layer in `model`."""
    found = []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            found += [v for v in (layer.moving_mean, layer.moving_variance) if v is not None]
    return found


class SyncMovingStatistics(keras.callbacks.Callback):
    """Averages BatchNormalization moving statistics over replicas after each batch call.

    A no-op with one replica. Works in `model.fit` and the tfaccel Trainer (after each
    step loop, so validation and checkpoints see the averaged values); the model must
    have been built under its strategy's scope.

    Example:
        >>> sync = tfaccel.callbacks.SyncMovingStatistics()
        >>> trainer.fit(data, callbacks=[sync])  # doctest: +SKIP
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def on_train_begin(self, logs: dict | None = None) -> None:
        variables = moving_statistics(self.model)
        strategy = self.model.distribute_strategy
        self._sync: Callable[[], None] | None = None
        if variables and strategy.num_replicas_in_sync > 1:
            sizes = [int(np.prod(v.shape)) for v in variables]

            @tf.function
            def sync():
                # One flat vector per replica: a single all-reduce for every statistic.
                flat = strategy.run(
                    lambda: tf.concat([tf.reshape(v.value, [-1]) for v in variables], 0)
                )
                mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, flat, axis=None)
                for variable, part in zip(variables, tf.split(mean, sizes), strict=True):
                    variable.assign(tf.reshape(part, variable.shape))

            self._sync = sync

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.sync()

    def on_train_end(self, logs: dict | None = None) -> None:
        self.sync()

    def sync(self) -> None:
        """Sets every replica's copy of each moving statistic to their mean."""
        sync = getattr(self, "_sync", None)
        if sync is not None:
            sync()
