"""The range test sized to the job: its ramp at most a share of the job's steps.

A learning-rate range test pays when it costs little beside the job it tunes. Given the
job's size (`job_examples`: epochs × examples, as `find_batch_size` takes), the ramp is
at most `RAMP_SHARE` of the job's steps (`job_examples // batch`), capped by
`num_steps`; below `MIN_RAMP` steps no test runs and the report says why.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfaccel.tuning.lr.report import LearningRateReport

RAMP_SHARE = 0.05  # the ramp's steps, at most, as a share of the job's steps
MIN_RAMP = 30  # ramp steps below which the test does not pay (>= lr_rule.MIN_POINTS)


def check_job_examples(job_examples: object) -> None:
    """Refuses a job size that is not a positive integer."""
    if isinstance(job_examples, bool) or not isinstance(job_examples, int) or job_examples < 1:
        raise ValueError(f"job_examples must be a positive integer, got {job_examples!r}.")


def batch_of(data: Any, y: Any, batch_size: int | None) -> int:
    """The global batch of `data`: `batch_size` for arrays, a dataset's static batch."""
    if y is not None or batch_size is not None:
        return batch_size or 32
    if isinstance(data, tf.data.Dataset):
        spec = tf.nest.flatten(data.element_spec)[0]
        if spec.shape.rank and spec.shape[0] is not None:
            return int(spec.shape[0])
    raise ValueError(
        "job_examples needs the batch to count the job's steps: pass batch_size (the "
        "data's batch is not static; batch a dataset with drop_remainder=True)."
    )


def assumed_batch(data: Any, y: Any, batch_size: int | None) -> int | None:
    """The batch a range test's rate is for (`batch_of`; None: the data's is not static)."""
    try:
        return batch_of(data, y, batch_size)
    except ValueError:
        return None


def ramp_steps(job_examples: int, batch: int, num_steps: int) -> tuple[int, int, int]:
    """(the ramp's steps, the steps needed, the job's steps) for a job of that size.

    The ramp is `RAMP_SHARE` of the job's steps, at most `num_steps`; it needs
    `MIN_RAMP` (or `num_steps`, if fewer) to pay.
    """
    job_steps = job_examples // batch
    return min(num_steps, int(RAMP_SHARE * job_steps)), min(num_steps, MIN_RAMP), job_steps


def not_run(
    steps: int, needed: int, job_steps: int, job_examples: int, batch: int
) -> LearningRateReport:
    """The report of a test that did not pay: no curve, no suggestion, the figures."""
    why = (
        f"too small to pay: the range test needs {needed} steps; {RAMP_SHARE:.0%} of this "
        f"job is {steps} ({job_examples} examples at batch {batch}: {job_steps} steps); "
        "keep the rate you have (or run the test without job_examples)"
    )
    return LearningRateReport(
        None, why, rates=[], losses=[], smoothed=[], minimum_rate=None, steepest_rate=None,
        noise=None, stopped="not run", steps=0, seconds=0.0, ramp_steps=0, batch_size=batch,
    )  # fmt: skip
