"""One `tune` for the batch and the rate: the batch first, then the rate at that batch.

Example:
    >>> job = tfaccel.tuning.TuningJob(build_model, (x, y),            # doctest: +SKIP
    ...                                loss="sparse_categorical_crossentropy", optimizer="adam")
    >>> tuned = tfaccel.tuning.tune(job, batch_size=32, learning_rate=1e-3, epochs=10)
    >>> print(tuned.arguments())
    --batch-size 64 --learning-rate 0.003
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.tuning.batch import budget, inputs
from tfaccel.tuning.batch.recommend import Recommendation, before_probing, recommend
from tfaccel.tuning.batch.report import BatchSizeReport
from tfaccel.tuning.batch.search import find_batch_size
from tfaccel.tuning.batch.settings import BatchSearch
from tfaccel.tuning.job import TuningJob, job_from, keywords
from tfaccel.tuning.lr import sizing as lr_sizing
from tfaccel.tuning.lr.finder import find_learning_rate
from tfaccel.tuning.lr.report import LearningRateReport

RAMP_BELOW, RAMP_ABOVE = 1e3, 1e2  # the rate's ramp: from rate / 1000 to rate × 100
PROBE_STEPS = 5  # timed steps a batch candidate (`find_batch_size`'s `steps`)


@dataclasses.dataclass
class Tuned:
    """What `tune` chose, and the reports behind it.

    Attributes:
        batch_size: the global batch to train with.
        learning_rate: the rate to train with: the range test's suggestion at that
            batch, or (no suggestion) the given rate scaled to the batch.
        batch: the batch step's `Recommendation` (the scaled rate, the reason).
        batch_report: `find_batch_size`'s report (None when the data alone decided).
        rate_report: `find_learning_rate`'s report (None when it was not run: `note`).
        seconds: the wall time of both steps.
        note: why the rate is the scaled one, when it is.
        methods: the `tfaccel.methods` to train with: the batch step's (a grown batch's
            one-cycle, sized to its scaled rate) when that rate is kept; none when the
            range test's rate wins (a cycle around it is unmeasured).
    """

    batch_size: int
    learning_rate: float
    batch: Recommendation
    batch_report: BatchSizeReport | None
    rate_report: LearningRateReport | None
    seconds: float
    note: str = ""
    methods: tuple = ()

    def arguments(self) -> str:
        """The command-line arguments to pass, e.g. "--batch-size 64 --learning-rate 0.003"
        (and "--one-cycle 0.009", its peak, when the tuned batch comes with a one-cycle)."""
        arguments = f"--batch-size {self.batch_size} --learning-rate {self.learning_rate:.3g}"
        peaks = [m.peak for m in self.methods if getattr(m, "peak", None) is not None]
        return arguments + "".join(f" --one-cycle {peak:.3g}" for peak in peaks)

    def __str__(self) -> str:
        rate = (
            self.rate_report.reason
            if self.rate_report is not None and self.rate_report.suggestion is not None
            else self.note
        )
        methods = ", ".join(m.name for m in self.methods) or "none"
        if self.batch.methods and not self.methods:
            methods += " (the batch step's one-cycle is for its scaled rate, not this one)"
        return (
            f"batch {self.batch_size}: {self.batch.reason}\n"
            f"learning rate {self.learning_rate:.3g}: {rate}\n"
            f"methods: {methods}\n"
            f"tuned in {self.seconds:.1f} s; pass {self.arguments()}"
        )


def _optimizer_at(optimizer, rate: float) -> keras.optimizers.Optimizer:
    if isinstance(optimizer, keras.optimizers.Optimizer):
        config = {**optimizer.get_config(), "learning_rate": rate}
        return type(optimizer).from_config(config)
    if isinstance(optimizer, str):
        built = keras.optimizers.get(optimizer)
        return type(built).from_config({**built.get_config(), "learning_rate": rate})
    built = optimizer()
    built.learning_rate = rate
    return built


def _rate_budget(spent: float, job_examples, eps, budget_s) -> float | None:
    """Seconds left for the rate under the batch tuner's bound (None: unbounded)."""
    limits = []
    if job_examples and eps:
        limits.append(budget.PROBE_SHARE * job_examples / eps - spent)
    if budget_s is not None:
        limits.append(budget_s - spent)
    return min(limits) if limits else None


def tune(
    job: TuningJob | Callable[[], keras.Model] | None = None,
    data: Any = None,
    /,
    *,
    batch_size: int,
    learning_rate: float,
    epochs: int | None = None,
    lr_steps: int = 100,
    verbose: int = 1,
    search: BatchSearch | None = None,
    **fields: Any,
) -> Tuned:
    """Tunes the batch (`find_batch_size`, `recommend`), then the rate at that batch.

    The rate step is a range test (`find_learning_rate`) on a fresh model from
    `build_model` at the chosen batch, ramped from the scaled rate / 1000 to × 100;
    its suggestion wins, and without one the scaled rate stays (`note` says why).
    With `epochs` or the job's `job_examples` both steps together keep within the batch
    tuner's bound, `budget.PROBE_SHARE` (10 %) of the job's time at the examples/s
    measured; the rate step is skipped when nothing is left, when the batch search
    declined at its first reading, or when that reading projects the range test (a
    build and trace as the first probe's, then its ramp) past what is left — `note`
    then says from what job size it fits. Its ramp is sized to the job
    (`find_learning_rate`'s `job_examples`: too small a job runs no ramp). The job's
    `budget_s` bounds both steps' wall seconds.

    Args:
        job: the job tuned: a `TuningJob`, or its `build_model` (then `data` and the
            job's other fields as keywords, e.g. `tune(build_model, (x, y), loss="mse",
            batch_size=32, learning_rate=1e-3)`). Its optimizer defaults to "adam"; its
            model is uncompiled.
        data: the job's data, when `job` is its `build_model`.
        batch_size: the global batch the job would train with untuned.
        learning_rate: the rate it would train with untuned.
        epochs: the job's epochs (its size is then epochs × the data's examples; the
            job's `job_examples` wins).
        lr_steps: steps of the range test.
        verbose: 1 prints the choice and the arguments to pass.
        search: the batch search's settings (`BatchSearch`; None: its defaults), started
            at `batch_size`: the batch is `recommend(find_batch_size(job,
            search=BatchSearch(start=batch_size, ...)), ...)`'s, the same answer as
            those two calls give for the job.
        **fields: a `TuningJob`'s fields (`loss`, `optimizer`, `strategy`,
            `job_examples`, `budget_s`...), each replacing the one in `job`.

    Returns:
        A `Tuned`: `batch_size`, `learning_rate`, `arguments()` and the reports.

    Raises:
        TypeError: a keyword that names no field of `TuningJob`, or no job.
    """
    began = time.perf_counter()
    (job_fields,) = keywords("tune", fields, TuningJob)
    job = job_from("tune", job, data, job_fields)
    strategy = job.strategy or tf.distribute.get_strategy()
    optimizer = "adam" if job.optimizer is None else job.optimizer
    dataset = inputs.to_unbatched_dataset(job.data)
    examples = int(dataset.cardinality())
    job_examples, budget_s = job.job_examples, job.budget_s
    if job_examples is None and epochs and examples > 0:
        job_examples = epochs * examples
    job = dataclasses.replace(
        job, data=dataset, optimizer=optimizer, strategy=strategy, job_examples=job_examples
    )
    users = {"batch_size": batch_size, "learning_rate": learning_rate, "optimizer": optimizer}
    search = dataclasses.replace(
        search or BatchSearch(steps=PROBE_STEPS),
        start=max(batch_size, strategy.num_replicas_in_sync),
    )
    choice, report = _batch_step(job, examples, users, search)
    eps = report.best_examples_per_second if report is not None else None
    left = _rate_budget(time.perf_counter() - began, job_examples, eps, budget_s)
    rate_report, note, rate = None, "", choice.learning_rate
    declined = _declined(
        report, choice, left, (lr_steps, search.steps), job_examples, budget_s, began
    )
    if left is not None and left <= 0:
        note = "the range test was skipped: the tuning bound was spent on the batch"
        note += f" (the batch search {report.declined})" if report and report.declined else ""
    elif declined:
        note = declined
    else:
        rate_report = _range_test(job, choice, lr_steps, left)
        if rate_report.suggestion is not None:
            rate = rate_report.suggestion
        else:
            note = f"kept the scaled rate: the range test gave none ({rate_report.reason})"
    seconds = time.perf_counter() - began
    kept = choice.methods if rate == choice.learning_rate else ()
    tuned = Tuned(choice.batch_size, rate, choice, report, rate_report, seconds, note, kept)
    if verbose:
        print(tuned)
    return tuned


def _batch_step(job: TuningJob, examples: int, users: dict, search: BatchSearch):
    """(Recommendation, BatchSizeReport or None): `before_probing`, else a search."""
    replicas = (job.strategy or tf.distribute.get_strategy()).num_replicas_in_sync
    if examples > 0:
        choice = before_probing(**users, examples=examples, replicas=replicas)
        if choice is not None:
            return choice, None
    report = find_batch_size(job, search=search)
    return recommend(report, **users, replicas=replicas), report


def _declined(report, choice, left, steps, job_examples, budget_s, began) -> str | None:
    """Why the range test is not started: the batch search declined at its first reading,
    or that reading projects the test (a build and trace as the first probe's, then its
    ramp at the measured examples/s) past what is left of the bound. None: run it."""
    if report is None or left is None:
        return None
    lr_steps, probe_steps = steps  # the range test's, a batch candidate's
    if report.declined:
        return f"the range test was skipped: the batch search {report.declined}"
    first = next(r for r in report.rows if r.fits and r.examples_per_second)
    ramp = lr_steps
    if job_examples:
        ramp, needed, _ = lr_sizing.ramp_steps(job_examples, choice.batch_size, lr_steps)
        if ramp < needed:
            return None  # the finder declines at no cost, and says why
    rate = budget.rate_at(report.rows, choice.batch_size)
    fixed = budget.fixed_seconds(first, probe_steps)
    projected = fixed + ramp * choice.batch_size / rate
    if projected <= left:
        return None
    spent = time.perf_counter() - began
    text = (
        f"the range test was skipped at the batch search's first reading: it would take "
        f"{projected:.2g} s (a build and trace of {fixed:.2g} s, {ramp} steps at batch "
        f"{choice.batch_size}), more than the {max(left, 0.0):.2g} s left of the bound"
    )
    if not job_examples or (budget_s is not None and budget_s < spent + projected):
        return f"{text}; from budget_s={spent + projected:.2g} up it fits"
    eps = report.best_examples_per_second or rate
    threshold = math.ceil((spent + projected) * eps / budget.PROBE_SHARE)
    return f"{text} ({budget.PROBE_SHARE:.0%} of the job); from {threshold:,} examples up it fits"


def _range_test(job: TuningJob, choice, steps, left):
    with (job.strategy or tf.distribute.get_strategy()).scope():
        model = job.build_model()
        model.compile(optimizer=_optimizer_at(job.optimizer, choice.learning_rate), loss=job.loss)
    batched = job.data.repeat().batch(choice.batch_size, drop_remainder=True)
    if not model.built:
        model(next(iter(batched))[0])
    return find_learning_rate(
        model,
        batched.prefetch(tf.data.AUTOTUNE),
        min_lr=choice.learning_rate / RAMP_BELOW,
        max_lr=choice.learning_rate * RAMP_ABOVE,
        num_steps=steps,
        budget_s=None if left is None else max(left, math.ulp(1.0)),
        job_examples=job.job_examples,
    )
