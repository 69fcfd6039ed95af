"""`find_batch_size`: the largest batch that fits, the throughput knee, the noise scale.

Example:
    >>> job = tfaccel.tuning.TuningJob(                               # doctest: +SKIP
    ...     build_model, (x_train, y_train), loss="sparse_categorical_crossentropy")
    >>> report = tfaccel.tuning.find_batch_size(job, search=tfaccel.tuning.BatchSearch(start=16))
    >>> print(report.table())
    >>> report.best_batch_size, report.max_batch_size
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.errors import NoBatchSizeFitsError  # noqa: F401 - raised here, imported from here
from tfaccel.tuning.batch import inputs, noise_probe, probes, time_to_accuracy
from tfaccel.tuning.batch.budget import TimeLimit
from tfaccel.tuning.batch.memory import MemoryMeter
from tfaccel.tuning.batch.report import BatchSizeReport, knee_batch_size
from tfaccel.tuning.batch.settings import BatchSearch
from tfaccel.tuning.job import TuningJob, job_from, keywords
from tfaccel.tuning.oom import release_memory

logger = logging.getLogger("tfaccel")


def find_batch_size(
    job: TuningJob | Callable[[], keras.Model] | None = None,
    data: Any = None,
    /,
    *,
    search: BatchSearch | None = None,
    **fields: Any,
) -> BatchSizeReport:
    """Finds the best global batch: the largest that fits, at or below the throughput knee
    and the gradient noise scale, leaving `min_steps_per_epoch` steps an epoch — and,
    within those, the one predicted to reach a given loss soonest (`time_to_accuracy`).

    The candidates share one model from `build_model` (built again, after releasing
    memory, only when a candidate fails), each running one warm-up step and `steps`
    timed training steps on `data` batched to the candidate: after the first two
    shapes Keras' train function is traced once for any batch (on a CPU, a ResNet's
    steps at batch 256 ran as fast in that trace as in one for the fixed shape), so a
    later candidate costs its steps alone. Memory is measured on a GPU as the
    allocator's peak (the weights included), on a CPU as the growth over the search's
    start.

    Candidates: `start`, 2×`start`, 4×`start`, ... until one fails; "binsearch" then
    bisects between the last fit and the first failure on multiples of `granularity`.
    If `start` itself fails, the search halves it until one fits. No candidate exceeds
    the data's examples (its length, or the examples counted up to the candidate for
    data of unknown length): a larger batch would repeat examples. Nor, when the
    examples are known and no `effective_batch_size` is asked for, does one leave fewer
    than `min_steps_per_epoch` steps an epoch. The report's `capped_by` says what ended
    the search.

    Running out of memory is caught as `tf.errors.ResourceExhaustedError` or XLA's
    `RESOURCE_EXHAUSTED`. On a CPU, where running out of memory kills the process,
    each candidate's memory is first predicted from the growth measured on the
    previous ones, and a candidate predicted over `memory_budget_mb` is not run
    (reason "budget").

    The job's time bounds the search: once `budget_s` is spent no new candidate is
    started (the report's `capped_by` is "time"; at least one candidate runs). Given
    `job_examples`, the search also stops once it has spent `budget.PROBE_AIM` (7.5 %)
    of that job's time at the fastest rate measured so far, to keep within
    `budget.PROBE_SHARE` (10 %) of the job as trained (a probe's examples/s reads low).
    A candidate whose predicted cost would pass the limit is not started. Before the
    first candidate's training step, its forward pass on one batch projects the least
    search that could change the batch (`early.project`); past that limit the search
    declines there (its first row "estimated", `declined` saying from what job size a
    search fits).

    Args:
        job: the job searched: a `TuningJob`, or its `build_model` (then `data` and the
            job's other fields as keywords, e.g. `find_batch_size(build_model, (x, y),
            loss="mse")`). Its optimizer defaults to "sgd".
        data: the job's data, when `job` is its `build_model`.
        search: the search's settings (`BatchSearch`: the candidates, their timing, the
            knee, the noise scale, steps per epoch...); None: the defaults.
        **fields: a `TuningJob`'s fields (`loss`, `optimizer`, `strategy`,
            `job_examples`, `budget_s`...) and a `BatchSearch`'s (`start`, `limit`,
            `steps`, `knee`...), each replacing the one in `job` or `search`.

    Returns:
        A `BatchSizeReport`.

    Raises:
        ValueError: a bad setting (see `BatchSearch`, `TuningJob`), data with fewer
            examples than replicas, a batched dataset, data that is not `(x, y)`, or an
            `effective_batch_size` not a multiple of the replicas.
        TypeError: a keyword that names no field of `TuningJob` or `BatchSearch`, no
            job, or `build_model` returns something other than a `keras.Model`.
        NoBatchSizeFitsError: not even the smallest batch tried fits.
    """
    began = time.perf_counter()  # the data's conversion counts against the time limit too
    job_fields, search_fields = keywords("find_batch_size", fields, TuningJob, BatchSearch)
    if search is None or search_fields:
        search = dataclasses.replace(search or BatchSearch(), **search_fields)
    job = job_from("find_batch_size", job, data, job_fields)
    dataset = inputs.without_rewrites(inputs.to_unbatched_dataset(job.data))
    strategy = job.strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    _check_effective(search.effective_batch_size, replicas)
    meter = MemoryMeter(probes.strategy_gpus(strategy, _gpu_names()))
    asked_mb = search.memory_budget_mb
    budget = meter.default_budget_mb() if asked_mb is None else asked_mb
    run = probes.Search(
        job.build_model,
        dataset,
        job.loss,
        "sgd" if job.optimizer is None else job.optimizer,
        strategy,
        search.steps,
        meter,
        budget if (not meter.on_gpu or asked_mb is not None) else None,
        search.clock,
        TimeLimit(began, job.budget_s, job.job_examples),
    )
    run.noise_asked, run.noise_warmup = search.noise_scale, search.noise_warmup
    run.confirm = search.confirm
    if search.effective_batch_size is None and search.min_steps_per_epoch > 1:
        run.min_steps_per_epoch = search.min_steps_per_epoch
    multiple = math.lcm(search.granularity, replicas)
    largest = _explore(run, search.start, search.limit, search.mode, multiple, replicas)
    if search.confirm:
        run.confirm_knee(search.knee)
    chosen = _choose(run, largest, search, multiple)
    return _report(run, chosen, search, budget, meter.on_gpu, began)


def _report(run, chosen, search: BatchSearch, budget, on_gpu, began) -> BatchSizeReport:
    """The report of a search and of `_choose`'s decision."""
    step = chosen["step"]
    replicas = run.strategy.num_replicas_in_sync
    effective = search.effective_batch_size
    return BatchSizeReport(
        max_batch_size=chosen["max_batch_size"],
        best_batch_size=chosen["best"],
        rows=run.rows,
        mode=search.mode,
        knee=float(search.knee),
        memory_budget_mb=None if budget is None else float(budget),
        memory_kind="device" if on_gpu else "host",
        probe_seconds=time.perf_counter() - began,
        effective_batch_size=effective,
        capped_by=chosen["capped_by"],
        examples=run.examples,
        noise_scale=None if step is None else step.b_simple,
        noise_scale_note="not asked for" if step is None else step.note,
        noise_scale_error=None if step is None else step.relative_error,
        limits=chosen["limits"],
        decided_by=chosen["decided_by"],
        declined=run.declined,
        compared=run.compared,
        accumulate_steps=(
            None
            if effective is None
            else accumulation_for(effective, chosen["max_batch_size"], replicas)
        ),
    )


def _check_effective(effective_batch_size: int | None, replicas: int) -> None:
    if effective_batch_size is not None and effective_batch_size % replicas:
        raise ValueError(
            f"effective_batch_size={effective_batch_size} is not a multiple of the "
            f"{replicas} replicas in sync: each replica needs an equal share. Use "
            f"{-(-effective_batch_size // replicas) * replicas}, for example."
        )


def _gpu_names() -> list[str]:
    return [d.name for d in tf.config.list_logical_devices("GPU")]


def _explore(run, start, limit, mode, multiple: int, replicas: int) -> int:
    """The candidates, tried (`probes.explore`) with the objects alive now out of the way of
    Python's collector; returns the largest batch that fits."""
    # `probes.explore` collects and freezes once the forward-pass reading declined nothing
    # (a collection costs 0.1-0.2 s on a CPU, a share of a small job's time).
    try:
        return probes.explore(run, start, limit, mode, multiple, replicas)
    finally:
        gc.unfreeze()
        if run.meter.on_gpu or not run.declined:
            release_memory()  # the last probe's data (its model is kept for the noise scale)


def _capped_by(rows) -> str | None:
    """What ended the search: the data, steps per epoch, the limit, time, or memory."""
    ends = ("data", "steps per epoch", "limit", "time")
    capped_by = next((r.reason for r in rows if r.reason in ends), None)
    if any(r.reason in ("oom", "budget") for r in rows):
        capped_by = "memory"
    return capped_by


def _noise_step(run, noise_scale: bool, max_batch: int, knee_batch: int, warmup):
    """The noise scale's reading (`noise_probe.NoiseStep`), or None when not asked for."""
    if not noise_scale:
        run.last_model = None
        return None
    if knee_batch <= min(r.batch_size for r in run.rows if r.fits):
        # The noise scale only stops an increase, and there is none: not measured.
        run.last_model = None
        return noise_probe.NoiseStep(
            None, 0, 0.0, "not measured: no batch above the first was faster (nothing to bound)"
        )
    return noise_probe.measure(run, run.time_limit, max_batch, knee_batch, warmup)


def _choose(run, largest, search: BatchSearch, multiple):
    """The best batch from the rows: the throughput knee, then each bound below it (the
    noise scale, steps per epoch), then the soonest to a loss; with what decided it."""
    knee = search.knee
    rows = run.rows
    max_batch_size = max(r.batch_size for r in rows if r.fits)
    knee_batch = knee_batch_size(rows, knee) or largest
    if run.knee_batch is not None:  # settled by interleaved readings (`confirm_knee`)
        knee_batch = run.knee_batch
    capped_by = _capped_by(rows)
    best, decided_by = knee_batch, "throughput knee"
    if knee_batch == max_batch_size and capped_by in ("memory", "steps per epoch"):
        decided_by = capped_by  # examples/s still grew at the largest batch allowed
    limits = {"memory": max_batch_size, "throughput knee": knee_batch}
    step = _noise_step(run, search.noise_scale, max_batch_size, knee_batch, search.noise_warmup)
    bounds = []  # (the largest batch it allows, its name)
    if step is not None:
        limits["noise scale"] = step.b_simple
        if step.reliable:  # too noisy an estimate is reported, not applied
            bounds.append((step.bound, "noise scale"))
    if run.examples:
        limits["steps per epoch"] = run.examples // search.min_steps_per_epoch
        bounds.append((limits["steps per epoch"], "steps per epoch"))
    fitting = sorted(r.batch_size for r in rows if r.fits)
    for bound, name in bounds:
        # The largest batch tried within the bound, or the bound itself rounded down to
        # the granularity (it fits: a larger batch did); the smallest tried at least.
        within = [b for b in fitting if b <= bound] or fitting[:1]
        rounded = int(min(bound, best)) // multiple * multiple if math.isfinite(bound) else 0
        allowed = max(within[-1], rounded if rounded >= fitting[0] else 0)
        if allowed < best:
            best, decided_by = allowed, name
    if step is not None and step.reliable and step.bound > 0:
        # Within the bounds, the batch reaching a loss soonest: a larger one must gain
        # more examples/s than the extra examples it needs (time_to_accuracy).
        soonest = time_to_accuracy.soonest_batch(rows, best, step.bound, knee)
        limits["time to accuracy"] = soonest
        if soonest < best:
            best, decided_by = soonest, "time to accuracy"
    return {
        "best": best,
        "decided_by": decided_by,
        "limits": limits,
        "capped_by": capped_by,
        "max_batch_size": max_batch_size,
        "step": step,
    }


def accumulation_for(effective: int, largest: int, replicas: int = 1) -> int:
    """The fewest accumulated batches k such that `effective / k` fits (`<= largest`).

    `effective / k` must be a whole global batch that divides among the replicas. k = 1
    when the effective batch fits as it is.
    """
    for k in range(1, effective // replicas + 1):
        if effective % k == 0 and (effective // k) % replicas == 0 and effective // k <= largest:
            return k
    raise ValueError(  # unreachable when the effective batch is a multiple of the replicas
        f"No accumulation of {effective} fits batches of at most {largest} on {replicas} replicas."
    )
