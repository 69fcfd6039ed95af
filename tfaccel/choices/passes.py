"""Forward and backward passes on one cached batch: timed by the precision and XLA
probes (`timing`) and by the doctor, which compare settings on the same work."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from tfaccel.data.elements import unpack


class GradientLoops:
    """Forward and backward passes only, with and without the gradient all-reduce.

    The replica step computes the loss and the gradients of the model's trainable
    variables exactly as a training step does (`PerExampleLoss`, mean over the global
    batch); `with_all_reduce` then sums them over the replicas with the call the Keras
    optimizer makes (`ReplicaContext.all_reduce("SUM", grads)`), `without` does not. No
    optimizer runs: the difference between the two is the all-reduce's cost inside a step.
    A training-mode forward pass still updates BatchNormalization's moving statistics:
    the caller restores them.
    """

    def __init__(
        self, model, loss, strategy: tf.distribute.Strategy, jit_compile: bool = False
    ) -> None:
        self.model, self.loss, self.strategy = model, loss, strategy
        # With jit_compile the replica's passes are one XLA cluster (`diagnose(deep=True)`).
        self._replica_fn = tf.function(self._replica, jit_compile=True) if jit_compile else None
        self.with_all_reduce = tf.function(lambda it, n: self._loop(it, n, True))
        self.without = tf.function(lambda it, n: self._loop(it, n, False))
        self._loss: Any = None

    def _replica(self, data, reduce: bool):
        x, y, sample_weight = unpack(data)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            per_example = self.loss(y, self.model(x, training=True), sample_weight)
            loss = tf.nn.compute_average_loss(per_example)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables) if g is not None]
        if reduce:
            grads = tf.distribute.get_replica_context().all_reduce("SUM", grads)
        # One element of each gradient keeps every gradient alive, at no cost.
        return tf.add_n([tf.cast(tf.reshape(g, [-1])[0], tf.float32) for g in grads])

    def _loop(self, iterator, steps, reduce: bool):
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            replica = self._replica_fn or self._replica
            out = self.strategy.run(replica, args=(next(iterator), reduce))
            total += tf.add_n(list(self.strategy.experimental_local_results(out)))
        return total

    def loss_once(self, iterator) -> float:
        """The loss of the next batch in inference mode (no dropout), compiled as the passes."""
        if self._loss is None:
            replica = self._replica_loss
            if self._replica_fn is not None:
                replica = tf.function(replica, jit_compile=True)
            self._loss = tf.function(
                lambda it: self.strategy.reduce(
                    "SUM", self.strategy.run(replica, args=(next(it),)), axis=None
                )
            )
        return float(self._loss(iterator))

    def _replica_loss(self, data):
        x, y, sample_weight = unpack(data)
        per_example = self.loss(y, self.model(x, training=False), sample_weight)
        return tf.cast(tf.nn.compute_average_loss(per_example), tf.float32)

    def seconds(self, reduce: bool, iterator, steps: int, calls: int) -> list[float]:
        fn = self.with_all_reduce if reduce else self.without
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn(iterator, tf.constant(steps, tf.int32)).numpy()
            times.append(time.perf_counter() - start)
        return times
