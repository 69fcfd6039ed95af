"""The largest batch that fits: `find_batch_size`'s memory search alone, as one number."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.tuning.batch.search import find_batch_size


def largest_batch_size(
    build_model: Callable[[], keras.Model],
    data: Any,
    *,
    loss: Any,
    optimizer: Any = "sgd",
    strategy: tf.distribute.Strategy | None = None,
    start: int = 8,
    limit: int | None = None,
    granularity: int = 8,
    steps: int = 1,
    memory_budget_mb: float | None = None,
    budget_s: float | None = None,
) -> int:
    """The largest global batch whose training steps fit in memory.

    `find_batch_size` answers "which batch to train with" (the throughput knee, the
    noise scale, enough steps an epoch, a share of the job's time), so its largest
    tried batch stops well short of memory. This asks memory alone: doubling from
    `start` until a candidate fails, then bisecting on multiples of `granularity`, with
    no limit from steps per epoch, the noise scale or the job's time. The data's
    examples still bound it (a larger batch would repeat examples): when the search
    ends for a reason other than memory a warning says so (the answer is then a lower
    bound). For the table of candidates, call `find_batch_size(...,
    min_steps_per_epoch=1, noise_scale=False)`.

    Args:
        build_model: zero-argument callable returning a `keras.Model`.
        data: an unbatched `tf.data.Dataset` of `(x, y)`, or an `(x, y)` tuple of arrays.
        loss: the loss, as for `model.compile`.
        optimizer: the optimizer (its slots count towards memory).
        strategy: a `tf.distribute.Strategy` (batches are global); None → the default.
        start: the first candidate.
        limit: the largest batch to try (None: memory alone).
        granularity: the answer is resolved to a multiple of this.
        steps: timed steps per candidate after its warm-up step.
        memory_budget_mb: the memory a candidate may use (default: as `find_batch_size`).
        budget_s: wall seconds the search may take.

    Returns:
        The largest batch that ran.

    Raises:
        NoBatchSizeFitsError: not even the smallest batch tried fits.
        ValueError: as `find_batch_size`.

    Warns:
        UserWarning: the search ended at the data's size, `limit` or `budget_s`, not at
            memory.
    """
    report = find_batch_size(
        build_model,
        data,
        loss=loss,
        optimizer=optimizer,
        strategy=strategy,
        start=start,
        limit=limit,
        mode="binsearch",
        granularity=granularity,
        steps=steps,
        memory_budget_mb=memory_budget_mb,
        noise_scale=False,
        min_steps_per_epoch=1,
        budget_s=budget_s,
        confirm=False,
    )
    if report.capped_by not in (None, "memory"):
        why = {
            "data": f"the data's {report.examples} examples",
            "limit": f"limit={limit}",
            "time": f"budget_s={budget_s}",
        }.get(report.capped_by, report.capped_by)
        warnings.warn(
            f"largest_batch_size: the search stopped at {why}, not at memory: batches "
            f"above {report.max_batch_size} were not tried and may fit.",
            stacklevel=2,
        )
    return report.max_batch_size
