"""The range test declines at its first readings when its ramp cannot fit the bound.

Given the job's size, before any step (`forward`): the model's forward pass on one
batch projects the test (`batch.early`: a training step's trace and first call, then the
ramp's steps); past the bound it stops there, having traced nothing but that pass.

After the first step (it traces) and `TIMED` more, the ramp's end is projected at the
fastest step measured. Past `budget_s` (`tune` passes what is left of its share), or,
given the job's size, past `PROBE_SHARE` (5 %) of the job's time at that step,
the test stops at once, rather than spending the bound on a ramp cut short or on a job
it cannot pay for, and says from what budget or job size it would run.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import keras
import tensorflow as tf

from tfaccel.tuning.batch import early
from tfaccel.tuning.lr.report import LearningRateReport

logger = logging.getLogger("tfaccel")

# The range test's share of the job's time, at most (issue 55: the finder costs at most
# 5 % where it runs; `tune`'s batch and rate steps together keep to `budget.PROBE_SHARE`).
PROBE_SHARE = 0.05

TIMED = 2  # timed steps after the first before the projection


def project(
    elapsed: float,
    done: int,
    step_s: float,
    num_steps: int,
    budget_s: float | None,
    job_steps: int | None = None,
    batch: int | None = None,
) -> str | None:
    """Why the ramp declines after `done` steps and `elapsed` s at `step_s` a step; None
    when it fits in `budget_s` and in `PROBE_SHARE` of a job of `job_steps` of `batch`."""
    projected = elapsed + (num_steps - done) * step_s
    ran = f"declined after {done} steps ({elapsed:.2g} s"
    ramp = f"the ramp of {num_steps} steps projects {projected:.2g} s"
    if budget_s is not None and projected > budget_s:
        return (
            f"{ran}): {ramp}, past budget_s={budget_s:.2g}; from budget_s={projected:.2g} up "
            "it runs"
        )
    if job_steps and batch and step_s > 0 and projected > PROBE_SHARE * job_steps * step_s:
        job_s = job_steps * step_s
        threshold = math.ceil(projected / (PROBE_SHARE * step_s)) * batch
        return (
            f"{ran}, {elapsed / job_s:.1%} of the job's {job_s:.2g} s): {ramp}, past "
            f"{PROBE_SHARE:.0%} of the job; from {threshold:,} examples up it runs"
        )
    return None


def forward(
    model: keras.Model,
    data: Any,
    y: Any,
    batch: int,
    num_steps: int,
    job_steps: int,
    budget_s: float | None,
) -> LearningRateReport | None:
    """The range test's earliest reading, before any step: a `LearningRateReport` that
    declines (stopped "declined") when the ramp cannot fit, else None.

    `batch.early` traces and times `model`'s forward pass on one batch (in inference
    mode: the model's state is left as it was) and projects the test: a training
    step's trace and first call, then `num_steps` steps, at `early`'s factors. Past
    `budget_s`, or past `PROBE_SHARE` of a job of `job_steps` steps, it stops there and
    says from what budget or job size the ramp runs. A model whose forward pass cannot
    be traced alone is left to the ramp's own first steps.
    """
    began = time.perf_counter()
    try:
        x = _one_batch(data, y, batch)
        reading = early.read_forward(model, x, batch, training=False)
    except Exception as error:  # noqa: BLE001 - optional: the ramp's own steps decide
        logger.info("find_learning_rate: no forward reading (%s)", error)
        return None
    spent = time.perf_counter() - began
    why = project_forward(
        spent, reading.fixed_s, batch / reading.examples_per_second, num_steps, budget_s,
        job_steps, batch,
    )  # fmt: skip
    if why is None:
        return None
    logger.info("find_learning_rate: %s", why)
    return LearningRateReport(
        None, why, rates=[], losses=[], smoothed=[], minimum_rate=None, steepest_rate=None,
        noise=None, stopped="declined", steps=0, seconds=spent, ramp_steps=num_steps,
        batch_size=batch,
    )  # fmt: skip


def project_forward(
    spent: float,
    fixed_s: float,
    step_s: float,
    num_steps: int,
    budget_s: float | None,
    job_steps: int,
    batch: int,
) -> str | None:
    """Why the ramp declines at its forward reading (after `spent` s; a trace of `fixed_s`
    and `num_steps` steps of `step_s` projected); None when it fits."""
    projected = spent + fixed_s + num_steps * step_s
    ran = f"declined at its forward reading, before any step, after {spent:.2g} s"
    ramp = (
        f"the ramp of {num_steps} steps projects {projected:.2g} s (a trace of about "
        f"{fixed_s:.2g} s and steps of {step_s:.2g} s, from the forward pass)"
    )
    if budget_s is not None and projected > budget_s:
        past = f"past budget_s={budget_s:.2g}; from budget_s={projected:.2g} up it runs"
        return f"{ran}: {ramp}, {past}"
    job_s = job_steps * step_s
    if projected <= PROBE_SHARE * job_s:
        return None
    threshold = math.ceil(projected / (PROBE_SHARE * step_s)) * batch
    return (
        f"{ran} ({spent / job_s:.1%} of the job's {job_s:.2g} s, projected): {ramp}, past "
        f"{PROBE_SHARE:.0%} of the job; from {threshold:,} examples up it runs"
    )


def _one_batch(data: Any, y: Any, batch: int) -> Any:
    """The features of one batch of `data` (arrays with `y`, or a batched dataset)."""
    if y is not None:
        return tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:batch]), data)
    if isinstance(data, tf.data.Dataset):
        element = next(iter(data.take(1)))
        return element[0] if isinstance(element, (tuple, list)) else element
    raise TypeError(f"no batch to read from {type(data).__name__}")
