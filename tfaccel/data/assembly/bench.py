"""`benchmark`: how fast a pipeline delivers batches, measured after warm-up."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf


def _batch_elements(batch: Any, strategy: tf.distribute.Strategy | None) -> int:
    if strategy is not None:
        parts = strategy.experimental_local_results(tf.nest.flatten(batch)[0])
    else:
        parts = [tf.nest.flatten(batch)[0]]
    total = 0
    for part in parts:
        shape = part.shape
        total += int(shape[0]) if shape.rank else 1
    return total


def _sync(batch: Any, strategy: tf.distribute.Strategy | None) -> None:
    first = tf.nest.flatten(batch)[0]
    parts = strategy.experimental_local_results(first) if strategy is not None else [first]
    for part in parts:
        part.numpy()


def benchmark(dataset: Any, *, batches: int = 100, warmup: int = 10) -> dict[str, float]:
    """Measures elements/s and batches/s of a pipeline after `warmup` batches.

    The first `warmup` batches (cache filling, autotuning, tracing) are not
    timed; the clock stops after a host sync (`.numpy()`) on the last batch.
    For a `DatasetFn` the distributed dataset is iterated and elements are
    summed over the replicas.

    Args:
        dataset: a `tf.data.Dataset` of batches (first axis = batch), or a
            `DatasetFn` from `pipeline`.
        batches: batches to time; fewer are timed if the dataset ends first.
        warmup: batches to read before timing.

    Returns:
        `{"elements_per_s", "batches_per_s", "elements", "batches", "seconds",
        "warmup"}`.

    Raises:
        ValueError: non-positive `batches` / negative `warmup`, or the dataset
            ends before any batch is timed (use `repeat=True`).
    """
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}.")
    strategy = getattr(dataset, "strategy", None) if callable(dataset) else None
    iterable = dataset.distribute() if strategy is not None else dataset
    iterator = iter(iterable)
    try:
        for _ in range(warmup):
            _sync(next(iterator), strategy)
    except StopIteration:
        raise ValueError(
            f"the dataset ended during the {warmup} warm-up batches; build it with "
            "repeat=True (or fewer warmup batches) to benchmark it."
        ) from None
    elements = timed = 0
    last = None
    start = time.perf_counter()
    for _ in range(batches):
        try:
            last = next(iterator)
        except StopIteration:
            break
        elements += _batch_elements(last, strategy)
        timed += 1
    if last is None:
        raise ValueError("the dataset ended before any batch was timed; build it with repeat=True.")
    _sync(last, strategy)
    seconds = time.perf_counter() - start
    return {
        "elements_per_s": elements / seconds,
        "batches_per_s": timed / seconds,
        "elements": elements,
        "batches": timed,
        "seconds": seconds,
        "warmup": warmup,
    }
