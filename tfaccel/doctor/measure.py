"""Timed pieces of a training step, each in seconds on this process's clock.

Every function here runs whole `tf.function` calls and returns wall times; callers
take the fastest of several calls where noise must not count (a shared machine only
ever slows a call down) and the total of back-to-back calls where the input pipeline's
buffers must not hide a slow producer.

Under `MultiWorkerMirroredStrategy` every worker runs the same calls in the same
order (collectives must match): sizes chosen from timings go through `agree` first.
"""

from __future__ import annotations

import time

import tensorflow as tf

from tfaccel.train import inputs
from tfaccel.train.agreement import agree, is_multi_worker  # noqa: F401 - this module's API
from tfaccel.train.steps import unpack


def train_calls(runner, iterator, steps: int, calls: int) -> tuple[list[float], list]:
    """`calls` back-to-back `runner.train(iterator, steps)`; (wall seconds, LoopResults)."""
    times, results = [], []
    for _ in range(calls):
        start = time.perf_counter()
        results.append(runner.train(iterator, steps))
        times.append(time.perf_counter() - start)
    return times, results


@tf.function
def _drain(iterator, batches):
    """Reads `batches` batches in the graph, as the step loop does, and nothing else."""
    done = tf.constant(0, tf.int32)
    for _ in tf.range(batches):
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        done += 1
    return done


def input_seconds(iterator, batches: int, calls: int) -> list[float]:
    """Wall seconds of `calls` reads of `batches` batches each (after one warm-up read)."""
    _drain(iterator, tf.constant(min(batches, 4), tf.int32)).numpy()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        _drain(iterator, tf.constant(batches, tf.int32)).numpy()
        times.append(time.perf_counter() - start)
    return times


def one_batch(data):
    """`data` reduced to its first batch, cached and repeated (same structure and type)."""

    def first(dataset):
        return dataset.take(1).cache().repeat()

    if inputs.is_dataset_fn(data):

        def fn(context):
            return first(data(context))

        fn.global_batch_size = getattr(data, "global_batch_size", None)
        return fn
    return first(data)


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

    def __init__(self, model, loss, strategy: tf.distribute.Strategy, jit_compile: bool = False):
        self.model, self.loss, self.strategy = model, loss, strategy
        # With jit_compile the replica's passes are one XLA cluster (`diagnose(deep=True)`).
        self._replica_fn = tf.function(self._replica, jit_compile=True) if jit_compile else None
        self.with_all_reduce = tf.function(lambda it, n: self._loop(it, n, True))
        self.without = tf.function(lambda it, n: self._loop(it, n, False))

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

    def seconds(self, reduce: bool, iterator, steps: int, calls: int) -> list[float]:
        fn = self.with_all_reduce if reduce else self.without
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn(iterator, tf.constant(steps, tf.int32)).numpy()
            times.append(time.perf_counter() - start)
        return times


def gradient_bytes(model) -> int:
    """Bytes of one gradient of every trainable variable (what the all-reduce moves)."""
    total = 0
    for variable in model.trainable_variables:
        size = int(tf.TensorShape(variable.shape).num_elements() or 0)
        total += size * tf.as_dtype(variable.dtype).size
    return total
