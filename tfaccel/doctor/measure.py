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
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tfaccel.choices.agreement import agree, is_multi_worker  # noqa: F401 - this module's API
from tfaccel.choices.passes import GradientLoops  # noqa: F401 - this module's API

if TYPE_CHECKING:
    from tfaccel.train.step.runner_interface import Batches, LoopResult, RunnerInterface


class CoresBusy:
    """Cores this process kept busy (its CPU seconds ÷ wall seconds) over the spans timed
    with it: `with meter: ...`, any number of times; `cores` is None before any."""

    def __init__(self) -> None:
        self.cpu_s = self.wall_s = 0.0

    def __enter__(self) -> CoresBusy:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s += time.process_time() - self._cpu
        self.wall_s += time.perf_counter() - self._wall

    @property
    def cores(self) -> float | None:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None


def train_calls(
    runner: RunnerInterface, iterator: Batches, steps: int, calls: int
) -> tuple[list[float], list[LoopResult]]:
    """`calls` back-to-back `runner.train(iterator, steps)`; (wall seconds, LoopResults)."""
    times: list[float] = []
    results: list[LoopResult] = []
    for _ in range(calls):
        start = time.perf_counter()
        results.append(runner.train(iterator, steps))
        times.append(time.perf_counter() - start)
    return times, results


@tf.function
def _drain_for(iterator, seconds, most):
    """Reads batches until `seconds` have passed (checked after each batch) or `most`
    were read; returns (batches read, seconds) — timed in the graph, each reading of the
    clock tied to the batch just read (else it may run before the read)."""
    start = tf.timestamp()
    done = tf.constant(0, tf.int64)
    elapsed = tf.constant(0.0, tf.float64)
    while done < most and elapsed < seconds:
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        done += 1
        with tf.control_dependencies(
            tf.nest.flatten(optional.get_value(), expand_composites=True)[:1]
        ):
            elapsed = tf.timestamp() - start
    return done, elapsed


def read_windows(
    iterator: Any, seconds: float, windows: int, most: int = 10_000_000
) -> tuple[float, list[float]]:
    """Reads `iterator` back to back for `windows` windows of `seconds` each; the first
    batch is timed alone first (a fresh iterator's start-up: opening files, filling
    buffers). Returns (start-up seconds, [seconds per batch of each window]).

    Back to back: no pause lets the pipeline's buffers fill between windows. A window
    ends at the first batch that finishes after its time, so one slow batch can
    overrun it by at most itself."""
    done, first = _drain_for(iterator, tf.constant(1e9, tf.float64), tf.constant(1, tf.int64))
    per_batch: list[float] = []
    for _ in range(windows):
        count, took = _drain_for(
            iterator, tf.constant(seconds, tf.float64), tf.constant(most, tf.int64)
        )
        if int(count):
            per_batch.append(float(took) / int(count))
    return float(first), per_batch


def train_windows(
    runner: RunnerInterface, iterator: Batches, steps: int, seconds: float, windows: int
) -> list[tuple[float, float | None]]:
    """The real step, back to back, in `windows` windows of about `seconds` each (calls
    of `steps` steps until a window's time has passed). Returns one
    `(seconds per step, input wait per step or None)` per window."""
    out: list[tuple[float, float | None]] = []
    for _ in range(windows):
        took, ran, start = 0.0, 0, time.perf_counter()
        waited: float | None = 0.0  # None once a call did not time its wait
        while took < seconds:
            result = runner.train(iterator, steps)
            took = time.perf_counter() - start
            ran += result.steps
            waited = (
                None
                if waited is None or result.input_wait_s is None
                else (waited + result.input_wait_s)
            )
        out.append((took / max(ran, 1), None if waited is None else waited / max(ran, 1)))
    return out


def gradient_bytes(model: keras.Model) -> int:
    """Bytes of one gradient of every trainable variable (what the all-reduce moves)."""
    total = 0
    for variable in model.trainable_variables:
        size = int(tf.TensorShape(variable.shape).num_elements() or 0)
        total += size * tf.as_dtype(variable.dtype).size
    return total
