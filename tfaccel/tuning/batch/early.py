"""The search's earliest reading: the model's forward pass, before any training step.

A training step's first call traces it (Keras' train function: the forward pass, its
gradient, the optimizer's updates), and on a small job that trace alone is a few per
cent of the job. Before it, the search builds the first candidate's model (the probe
keeps it) and traces and times its forward pass on one batch — a graph a tenth to a
thirtieth of the train step's, traced in tens of milliseconds — and projects from it:

- a training step ≈ `STEP_PER_FORWARD` × the forward pass (1.9–6.2× measured on eight
  Keras models on a 2-core CPU: MLPs, small CNNs, the digits ResNet, a ResNet-18);
- a probe's fixed cost (build, trace, first call) ≈ `FIXED_BASE_S` +
  `FIXED_PER_FORWARD_TRACE` × the forward pass's trace (within ±40 % of the measured
  fixed cost on those models, 0.3–5.6 s);
- a search that can change the batch runs at least two candidates (`start` and
  2 × `start`: two traces, the second shape retraces; each `steps` + 1 steps, and as many
  again when `confirm` times them twice), the noise scale's estimate (a third trace) and
  its warm-up (by default one pass over the data, at most 50,000 examples; at most
  `budget.NOISE_SHARE` of the limit).

When that least search, on top of what was spent, passes `budget.PROBE_AIM` of the job
(its examples at the projected examples/s), the job is too small to pay: the search
declines there, having run no training step, and says from what job size a search fits.
Otherwise the first candidate runs as before and its own reading decides again
(`budget.declined`). Only the job's share is projected this way: with `budget_s` alone
the first candidate always runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.tuning.batch.budget import NOISE_SHARE, PROBE_AIM

logger = logging.getLogger("tfaccel")

STEP_PER_FORWARD = 3.0  # a training step over the forward pass (1.9-6.2x measured)
FIXED_BASE_S = 0.3  # s: Keras' train function's trace and first call, for any model
FIXED_PER_FORWARD_TRACE = 11.0  # and this many times the forward pass's trace
FIXED_COSTS = 3  # traces of the least search: two candidates' shapes, the noise scale
NOISE_BATCHES = 16  # the noise scale's big batches (noise_probe.BATCHES) and 8x small


@dataclasses.dataclass(frozen=True)
class ForwardReading:
    """One batch's forward pass: its trace's seconds and its fastest call's."""

    batch: int
    trace_s: float
    forward_s: float

    @property
    def fixed_s(self) -> float:
        """A probe's projected fixed cost: build, trace and first call of a training step."""
        return FIXED_BASE_S + FIXED_PER_FORWARD_TRACE * self.trace_s

    @property
    def examples_per_second(self) -> float:
        """The projected training examples/s at this batch."""
        return self.batch / (STEP_PER_FORWARD * max(self.forward_s, 1e-9))


_warm = False  # whether this process has traced a forward pass here already


def read_forward(
    model: keras.Model,
    x: Any,
    batch: int,
    clock: Callable[[], float] = time.perf_counter,
    training: bool = True,
) -> ForwardReading:
    """Traces `model`'s forward pass on `x` (one batch) and times three calls of it.

    A process's first reading traces twice and keeps the faster: the first trace also
    pays TensorFlow's one-time set-up, which the training step's trace will not.
    `training=False` leaves the model's state (moving statistics, seed generators) as
    it was.
    """
    global _warm

    def sync(outputs) -> None:
        leaves = tf.nest.flatten(outputs)
        if leaves:
            leaves[0].numpy()

    traces = []
    for _ in range(1 if _warm else 2):
        call = tf.function(lambda inputs: model(inputs, training=training), autograph=False)
        began = clock()
        sync(call(x))
        traces.append(clock() - began)
    times = []
    for _ in range(3):
        start = clock()
        sync(call(x))
        times.append(clock() - start)
    _warm = True
    return ForwardReading(batch, min(traces), min(times))


def least_search_s(
    reading: ForwardReading, steps: int, examples: int | None, noise: bool, confirm: bool = True
) -> float:
    """Projected seconds of the least search that can change the batch (see the module),
    its noise scale's warm-up aside (`warmup_s`)."""
    batch, rate = reading.batch, reading.examples_per_second
    seconds = (FIXED_COSTS if noise else FIXED_COSTS - 1) * reading.fixed_s
    # `start`, 2 x `start`, then both timed again (`confirm_knee`)
    seconds += (steps + 1) * (6 if confirm else 3) * batch / rate
    if noise:
        big = max(2 * batch, 64) if examples is None else min(max(2 * batch, 64), examples)
        small = max(1, min(8, big // 4))
        seconds += NOISE_BATCHES * (8 * small + big) / rate
    return seconds


def warmup_s(reading: ForwardReading, warmup_examples: int, limit_s: float) -> float:
    """The noise scale's warm-up at the projected examples/s, within its share of the limit."""
    return min(warmup_examples / reading.examples_per_second, NOISE_SHARE * limit_s)


def project(
    reading: ForwardReading,
    spent: float,
    job_examples: int | None,
    steps: int,
    examples: int | None,
    warmup: int | None,
    confirm: bool = True,
) -> str | None:
    """Why the search declines at its forward reading (None: the first candidate runs).

    `warmup`: the noise scale's warm-up in examples (None: no noise scale)."""
    if not job_examples:
        return None
    rate, noise = reading.examples_per_second, warmup is not None
    job_s = job_examples / rate
    least = least_search_s(reading, steps, examples, noise, confirm)
    least += warmup_s(reading, warmup, PROBE_AIM * job_s) if warmup is not None else 0.0
    if spent + least <= PROBE_AIM * job_s:
        return None
    threshold = _threshold(reading, spent, steps, examples, warmup, confirm)
    return (
        f"declined at the first reading (the forward pass, before any training step), after "
        f"{spent:.2g} s ({spent / job_s:.1%} of the job's {job_s:.3g} s, projected): a search "
        f"(batches {reading.batch} and {2 * reading.batch}"
        + (", the noise scale and its warm-up" if noise else "")
        + f"; traces of about {reading.fixed_s:.2g} s each) would take {least:.2g} s more, "
        f"past {PROBE_AIM:.1%} of the job; from {threshold:,} examples up, a search fits"
    )


def _threshold(reading, spent, steps, examples, warmup, confirm) -> int:
    """The least job (examples) whose `PROBE_AIM` holds the search and its warm-up."""
    rate = reading.examples_per_second
    fixed = spent + least_search_s(reading, steps, examples, warmup is not None, confirm)
    whole = fixed + (warmup / rate if warmup is not None else 0.0)
    job_s = whole / PROBE_AIM
    if warmup is not None and warmup / rate > NOISE_SHARE * PROBE_AIM * job_s:
        job_s = fixed / ((1 - NOISE_SHARE) * PROBE_AIM)  # the warm-up shrinks to its share
    return math.ceil(job_s * rate)
