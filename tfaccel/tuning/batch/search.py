"""`find_batch_size`: the largest batch that fits, the throughput knee, the noise scale.

Example:
    >>> report = tfaccel.tuning.find_batch_size(                      # doctest: +SKIP
    ...     build_model, (x_train, y_train), loss="sparse_categorical_crossentropy")
    >>> print(report.table())
    >>> report.best_batch_size, report.max_batch_size
"""

from __future__ import annotations

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
from tfaccel.tuning.oom import (
    release_memory,
)

logger = logging.getLogger("tfaccel")

MODES = ("power", "binsearch")


def find_batch_size(
    build_model: Callable[[], keras.Model],
    data: Any,
    *,
    loss: Any,
    optimizer: Any = "sgd",
    strategy: tf.distribute.Strategy | None = None,
    start: int = 8,
    limit: int | None = None,
    mode: str = "binsearch",
    granularity: int = 8,
    steps: int = 5,
    memory_budget_mb: float | None = None,
    knee: float = 0.05,
    effective_batch_size: int | None = None,
    noise_scale: bool = True,
    noise_warmup: int | None = None,
    min_steps_per_epoch: int = 20,
    budget_s: float | None = None,
    job_examples: int | None = None,
    confirm: bool = True,
    clock: Callable[[], float] = time.perf_counter,
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

    Args:
        build_model: zero-argument callable returning a `keras.Model` (called per probe,
            inside `strategy.scope()`).
        data: an *unbatched* `tf.data.Dataset` of `(x, y)`, or an `(x, y)` tuple of arrays.
        loss: the loss, as for `model.compile`.
        optimizer: a Keras optimizer (cloned per probe), its name, or a callable.
        strategy: a `tf.distribute.Strategy`; None → the default strategy. Batches are global.
        start: the first candidate.
        limit: the largest batch to try; None → only memory limits it.
        mode: "power" (powers of two times `start`) or "binsearch".
        granularity: "binsearch" resolves the largest fitting batch to a multiple of this.
        steps: timed steps per candidate, after one warm-up step; the candidate's
            examples/s is its batch over the median step time.
        memory_budget_mb: the memory a probe may use, in MiB. Default on a CPU: half the
            available host memory (RSS growth over the start of the search); on a GPU:
            the device memory (and no prediction: out-of-memory is caught instead).
        knee: `best_batch_size` is the smallest batch within this fraction of the highest
            examples/s.
        effective_batch_size: a global batch to train with even if it does not fit; the
            report's `accumulate_steps` is then the fewest batches to accumulate (see
            `Trainer(accumulate_steps=...)`) so that each fits.
        noise_scale: estimate the gradient noise scale B_simple (`gradient_noise_scale`,
            after a warm-up: see `noise_warmup`) and keep `best_batch_size` at or below
            it: past B_simple a larger batch spends examples without saving steps. Within
            the limits, the batch is then the smallest whose predicted time to a loss,
            (1 + B / B_simple) / examples/s, is within `knee` of the least. Both rules
            take the largest B_simple the estimate supports (`noise.upper_limit`: two
            standard errors up); an estimate too noisy to tell (relative standard error
            from `noise.MAX_ERROR` on) is reported but applies neither. On by default;
            it continues from the last probe's model. Under a time limit its predicted
            cost is reserved: no candidate is started that would eat into it. It is
            skipped (the report's `noise_scale_note` says so) when its cost does not
            fit even so (e.g. the first candidate took the whole limit).
        noise_warmup: examples to train the model on (at the throughput knee, the
            optimizer as given) before estimating the noise scale, which grows as the
            loss falls. None: one pass over the data (at most 50,000 examples), or what
            the time limit leaves; 0: at the probes' model's weights (`steps` + 1 steps a
            candidate from the initial weights). Not measured when no batch above the
            first was faster: it only stops an increase.
        min_steps_per_epoch: `best_batch_size` leaves at least this many optimizer steps
            per epoch when the data's examples are known (a batch of the whole data
            trains one step an epoch, however fast); 1 turns the rule off.
        budget_s: wall seconds the search may take; once spent, no new candidate is
            started (the report's `capped_by` is "time"). At least one candidate runs.
        job_examples: the size of the training job being tuned (epochs × examples per
            epoch); the search then also stops once it has spent `budget.PROBE_AIM`
            (7.5 %) of that job's time at the fastest rate measured so far, to keep
            within `budget.PROBE_SHARE` (10 %) of the job as trained (a probe's
            examples/s reads low). A candidate whose predicted cost would pass the limit
            is not started. Before the first candidate's training step, its forward pass
            on one batch projects the least search that could change the batch
            (`early.project`); past that limit the search declines there (its first row
            "estimated", `declined` saying from what job size a search fits).
        confirm: time the knee and the first candidate once more before choosing (each
            row's examples/s becomes the mean of its two readings), within the time limit.
        clock: the timing source for the timed steps (seconds; inject a fake one in tests).

    Returns:
        A `BatchSizeReport`.

    Raises:
        ValueError: `start` < 1, `granularity` < 1, `steps` < 1, `limit` < `start`, data
            with fewer examples than replicas, an
            unknown `mode`, `knee` outside [0, 1), a batched dataset, data that is not
            `(x, y)`, or an `effective_batch_size` < 1 or not a multiple of the replicas.
        TypeError: `build_model` returns something other than a `keras.Model`.
        NoBatchSizeFitsError: not even the smallest batch tried fits.
    """
    began = time.perf_counter()  # the data's conversion counts against the time limit too
    _check_arguments(
        build_model,
        start=start,
        limit=limit,
        mode=mode,
        granularity=granularity,
        steps=steps,
        min_steps_per_epoch=min_steps_per_epoch,
        noise_warmup=noise_warmup,
        knee=knee,
        effective_batch_size=effective_batch_size,
        budget_s=budget_s,
        job_examples=job_examples,
        memory_budget_mb=memory_budget_mb,
    )
    dataset = inputs.without_rewrites(inputs.to_unbatched_dataset(data))
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    _check_effective(effective_batch_size, replicas)
    meter = MemoryMeter(probes.strategy_gpus(strategy, _gpu_names()))
    budget = meter.default_budget_mb() if memory_budget_mb is None else memory_budget_mb
    search = probes.Search(
        build_model,
        dataset,
        loss,
        optimizer,
        strategy,
        steps,
        meter,
        budget if (not meter.on_gpu or memory_budget_mb is not None) else None,
        clock,
        TimeLimit(began, budget_s, job_examples),
    )
    search.noise_asked, search.noise_warmup = noise_scale, noise_warmup
    search.confirm = confirm
    if effective_batch_size is None and min_steps_per_epoch > 1:
        search.min_steps_per_epoch = min_steps_per_epoch
    multiple = math.lcm(granularity, replicas)
    largest = _explore(search, start, limit, mode, multiple, replicas)
    if confirm:
        search.confirm_knee(knee)
    chosen = _choose(
        search, largest, knee, noise_scale, noise_warmup, min_steps_per_epoch, multiple
    )
    return _report(search, chosen, mode, knee, budget, meter.on_gpu, began, effective_batch_size)


def _report(search, chosen, mode, knee, budget, on_gpu, began, effective) -> BatchSizeReport:
    """The report of a search and of `_choose`'s decision."""
    step = chosen["step"]
    replicas = search.strategy.num_replicas_in_sync
    return BatchSizeReport(
        max_batch_size=chosen["max_batch_size"],
        best_batch_size=chosen["best"],
        rows=search.rows,
        mode=mode,
        knee=float(knee),
        memory_budget_mb=None if budget is None else float(budget),
        memory_kind="device" if on_gpu else "host",
        probe_seconds=time.perf_counter() - began,
        effective_batch_size=effective,
        capped_by=chosen["capped_by"],
        examples=search.examples,
        noise_scale=None if step is None else step.b_simple,
        noise_scale_note="not asked for" if step is None else step.note,
        noise_scale_error=None if step is None else step.relative_error,
        limits=chosen["limits"],
        decided_by=chosen["decided_by"],
        declined=search.declined,
        accumulate_steps=(
            None
            if effective is None
            else accumulation_for(effective, chosen["max_batch_size"], replicas)
        ),
    )


def _check_arguments(build_model, **a) -> None:
    """`find_batch_size`'s argument checks (the messages say what to pass instead)."""
    for name in ("start", "granularity", "steps", "min_steps_per_epoch"):
        probes.check_int(name, a[name], 1)
    if a["noise_warmup"] is not None:
        probes.check_int("noise_warmup", a["noise_warmup"], 0)
    if a["limit"] is not None:
        probes.check_int("limit", a["limit"], 1)
        if a["limit"] < a["start"]:
            raise ValueError(
                f"limit ({a['limit']}) is smaller than start ({a['start']}): no candidate to "
                "try. Lower start or raise limit (or pass limit=None)."
            )
    if a["mode"] not in MODES:
        raise ValueError(f"Unknown mode {a['mode']!r}. Expected one of {MODES}.")
    knee = a["knee"]
    if isinstance(knee, bool) or not isinstance(knee, (int, float)) or not 0 <= knee < 1:
        raise ValueError(f"knee must be a fraction in [0, 1), e.g. 0.05 for 5 %; got {knee!r}.")
    if a["effective_batch_size"] is not None:
        probes.check_int("effective_batch_size", a["effective_batch_size"], 1)
    budget_s = a["budget_s"]
    if budget_s is not None and (isinstance(budget_s, bool) or not budget_s >= 0):
        raise ValueError(f"budget_s must be a number of seconds >= 0, got {budget_s!r}.")
    if a["job_examples"] is not None:
        probes.check_int("job_examples", a["job_examples"], 1)
    memory = a["memory_budget_mb"]
    if memory is not None and not memory > 0:
        raise ValueError(f"memory_budget_mb must be > 0 MiB, got {memory!r}.")
    if not callable(build_model):
        raise TypeError(
            f"build_model must be a zero-argument callable returning a keras.Model, got "
            f"{type(build_model).__name__}. Pass the function, not a model: e.g. "
            "find_batch_size(lambda: make_model(), ...)."
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


def _explore(search, start, limit, mode, multiple: int, replicas: int) -> int:
    """The candidates, tried (`probes.explore`) with the objects alive now out of the way of
    Python's collector; returns the largest batch that fits."""
    # `probes.explore` collects and freezes once the forward-pass reading declined nothing
    # (a collection costs 0.1-0.2 s on a CPU, a share of a small job's time).
    try:
        return probes.explore(search, start, limit, mode, multiple, replicas)
    finally:
        gc.unfreeze()
        if search.meter.on_gpu or not search.declined:
            release_memory()  # the last probe's data (its model is kept for the noise scale)


def _capped_by(rows) -> str | None:
    """What ended the search: the data, steps per epoch, the limit, time, or memory."""
    ends = ("data", "steps per epoch", "limit", "time")
    capped_by = next((r.reason for r in rows if r.reason in ends), None)
    if any(r.reason in ("oom", "budget") for r in rows):
        capped_by = "memory"
    return capped_by


def _noise_step(search, noise_scale: bool, max_batch: int, knee_batch: int, warmup):
    """The noise scale's reading (`noise_probe.NoiseStep`), or None when not asked for."""
    if not noise_scale:
        search.last_model = None
        return None
    if knee_batch <= min(r.batch_size for r in search.rows if r.fits):
        # The noise scale only stops an increase, and there is none: not measured.
        search.last_model = None
        return noise_probe.NoiseStep(
            None, 0, 0.0, "not measured: no batch above the first was faster (nothing to bound)"
        )
    return noise_probe.measure(search, search.time_limit, max_batch, knee_batch, warmup)


def _choose(search, largest, knee, noise_scale, noise_warmup, min_steps_per_epoch, multiple):
    """The best batch from the rows: the throughput knee, then each bound below it (the
    noise scale, steps per epoch), then the soonest to a loss; with what decided it."""
    rows = search.rows
    max_batch_size = max(r.batch_size for r in rows if r.fits)
    knee_batch = knee_batch_size(rows, knee) or largest
    capped_by = _capped_by(rows)
    best, decided_by = knee_batch, "throughput knee"
    if knee_batch == max_batch_size and capped_by in ("memory", "steps per epoch"):
        decided_by = capped_by  # examples/s still grew at the largest batch allowed
    limits = {"memory": max_batch_size, "throughput knee": knee_batch}
    step = _noise_step(search, noise_scale, max_batch_size, knee_batch, noise_warmup)
    bounds = []  # (the largest batch it allows, its name)
    if step is not None:
        limits["noise scale"] = step.b_simple
        if step.reliable:  # too noisy an estimate is reported, not applied
            bounds.append((step.bound, "noise scale"))
    if search.examples:
        limits["steps per epoch"] = search.examples // min_steps_per_epoch
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
