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

from tfaccel.train.agreement import agree, is_multi_worker  # noqa: F401 - this module's API
from tfaccel.train.passes import GradientLoops, one_batch  # noqa: F401 - this module's API


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


def gradient_bytes(model) -> int:
    """Bytes of one gradient of every trainable variable (what the all-reduce moves)."""
    total = 0
    for variable in model.trainable_variables:
        size = int(tf.TensorShape(variable.shape).num_elements() or 0)
        total += size * tf.as_dtype(variable.dtype).size
    return total
