"""The largest batch that fits: `find_batch_size`'s memory search alone, as one number."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import keras

from tfaccel.tuning.batch.search import find_batch_size
from tfaccel.tuning.batch.settings import BatchSearch
from tfaccel.tuning.job import TuningJob, job_from, keywords


def largest_batch_size(
    job: TuningJob | Callable[[], keras.Model] | None = None,
    data: Any = None,
    /,
    *,
    start: int = 8,
    limit: int | None = None,
    granularity: int = 8,
    steps: int = 1,
    memory_budget_mb: float | None = None,
    **fields: Any,
) -> int:
    """The largest global batch whose training steps fit in memory.

    `find_batch_size` answers "which batch to train with" (the throughput knee, the
    noise scale, enough steps an epoch, a share of the job's time), so its largest
    tried batch stops well short of memory. This asks memory alone: doubling from
    `start` until a candidate fails, then bisecting on multiples of `granularity`, with
    no limit from steps per epoch, the noise scale or the job's size (its
    `job_examples` is not used). The data's examples still bound it (a larger batch
    would repeat examples), and so does the job's `budget_s`: when the search ends for
    a reason other than memory a warning says so (the answer is then a lower bound).
    For the table of candidates, call `find_batch_size(job,
    search=BatchSearch(min_steps_per_epoch=1, noise_scale=False))`.

    Args:
        job: the job: a `TuningJob`, or its `build_model` (then `data` and the job's
            other fields as keywords, e.g. `largest_batch_size(build_model, (x, y),
            loss="mse")`). Its optimizer (default "sgd") counts towards memory: its slots.
        data: the job's data, when `job` is its `build_model`.
        start: the first candidate.
        limit: the largest batch to try (None: memory alone).
        granularity: the answer is resolved to a multiple of this.
        steps: timed steps per candidate after its warm-up step.
        memory_budget_mb: the memory a candidate may use (default: as `find_batch_size`).
        **fields: a `TuningJob`'s fields (`loss`, `optimizer`, `strategy`, `budget_s`...),
            each replacing the one in `job`.

    Returns:
        The largest batch that ran.

    Raises:
        NoBatchSizeFitsError: not even the smallest batch tried fits.
        ValueError: as `find_batch_size`.
        TypeError: a keyword that names no field of `TuningJob`, or no job.

    Warns:
        UserWarning: the search ended at the data's size, `limit` or `budget_s`, not at
            memory.
    """
    (job_fields,) = keywords("largest_batch_size", fields, TuningJob)
    job = job_from("largest_batch_size", job, data, job_fields)
    search = BatchSearch(
        start=start,
        limit=limit,
        mode="binsearch",
        granularity=granularity,
        steps=steps,
        memory_budget_mb=memory_budget_mb,
        noise_scale=False,
        min_steps_per_epoch=1,
        confirm=False,
    )
    report = find_batch_size(dataclasses.replace(job, job_examples=None), search=search)
    if report.capped_by not in (None, "memory"):
        why = {
            "data": f"the data's {report.examples} examples",
            "limit": f"limit={limit}",
            "time": f"budget_s={job.budget_s}",
        }.get(report.capped_by, report.capped_by)
        warnings.warn(
            f"largest_batch_size: the search stopped at {why}, not at memory: batches "
            f"above {report.max_batch_size} were not tried and may fit.",
            stacklevel=2,
        )
    return report.max_batch_size
