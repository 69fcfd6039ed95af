"""The learning-rate range test: ramp the rate, read the loss, put everything back.

`find_learning_rate(trainer or compiled model, data)` trains up to `num_steps` steps with
the rate ramped exponentially from `min_lr` to `max_lr` (one rate per step), stopping
early when the loss diverges or `budget_s` is spent, and reads the curve with
`lr_rule.suggest`. Given the job's size (`job_examples`), the ramp is sized to it
(`lr_sizing`: at most 5 % of the job's steps; too small a job runs no test).
The ramp is a Keras callback (`LRRangeTest`), so `model.fit` and `Trainer.fit` run it
alike, on any number of replicas.

Restored afterwards, so that a fit after the test equals one without it: the model's
variables, the optimizer's (slots, `iterations`, the rate or the schedule), the metrics'
state, the Trainer's step counters and its settings, the model's `history`, and Python's
and NumPy's global random generators (array inputs are shuffled from them). The data
position: each fit reads its data from the start, so the test moves nothing — except a
`tf.data` dataset that reshuffles each iteration (its next order is drawn from a
generator inside the dataset: give the test its own copy of the pipeline for an exact
fit afterwards) and a Python iterator (consumed).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from tfaccel.train.loop.faults import TrainingDivergedError
from tfaccel.tuning.job import keywords
from tfaccel.tuning.lr import decline as lr_decline
from tfaccel.tuning.lr import inputs as lr_inputs
from tfaccel.tuning.lr import nonfinite as lr_nonfinite
from tfaccel.tuning.lr import rule as lr_rule
from tfaccel.tuning.lr import sizing as lr_sizing
from tfaccel.tuning.lr.ramp import LRRamp
from tfaccel.tuning.lr.report import LearningRateReport

if TYPE_CHECKING:
    from tfaccel.train.trainer import Trainer

RECENT = 5  # divergence is read on the median of the last few losses


class LRRangeTest(keras.callbacks.Callback):
    """Ramps the learning rate exponentially, one rate per step, and records the loss.

    Stops training (`model.stop_training`) at the ramp's end, when the loss is not
    finite, when the median of the last 5 losses exceeds `stop_factor` × its lowest (after
    a tenth of the ramp), or when `budget_s` is spent. Each batch hook records one point:
    the step's loss (or a loop's mean loss when a loop runs several steps), recovered from
    the epoch's running mean. Use it inside one epoch, on an optimizer that `RateControl`
    drives.

    Args:
        control: a `RateControl` on the optimizer.
        min_lr: the ramp's first rate.
        max_lr: the ramp's last rate.
        num_steps: steps of the ramp.
        budget_s: stop after this many seconds (None: no limit).
        stop_factor: the divergence threshold (a multiple of the lowest loss).
        on_begin: called with no argument at `on_train_begin` (the snapshot).
        job_steps: the job's steps, when known.
        batch: the job's batch, when known.
        clock: seconds (a fake one in tests). The first timed steps project the ramp's
            end; past `budget_s` or a share of the job it declines at once (`lr_decline`).
    """

    def __init__(
        self,
        control: RateControl,
        min_lr: float,
        max_lr: float,
        num_steps: int,
        budget_s: float | None = None,
        stop_factor: float = 4.0,
        on_begin: Callable[[], object] | None = None,
        *,
        job_steps: int | None = None,
        batch: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        self.job_steps, self.batch, self.clock = job_steps, batch, clock
        self.declined: str | None = None
        self._ends: list[tuple[float, int]] = []
        self.control = control
        self.min_lr, self.max_lr, self.num_steps = float(min_lr), float(max_lr), int(num_steps)
        self.budget_s, self.stop_factor, self.on_begin = budget_s, stop_factor, on_begin
        self.rates: list[float] = []
        self.losses: list[float] = []
        self.stopped = "data"
        self.done = 0
        self._mean = 0.0
        self._rate = self.min_lr
        self._best = math.inf
        self._began = clock()

    def rate_at(self, step: int) -> float:
        """The ramp's rate at `step` (0-based): min_lr × (max_lr / min_lr)^(step / (n - 1))."""
        frac = step / max(self.num_steps - 1, 1)
        return self.min_lr * (self.max_lr / self.min_lr) ** frac

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.on_begin is not None:
            self.on_begin()
        self._began = self.clock()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._rate = self.rate_at(self.done)
        self.control.set(self._rate)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        done = int(batch) + 1  # steps into the epoch (Keras and the Trainer count alike)
        mean = float((logs or {}).get("loss", math.nan))
        ran = max(done - self.done, 1)
        loss = (done * mean - self.done * self._mean) / ran
        self.rates.append(self._rate)
        self.losses.append(loss)
        self.done, self._mean = done, mean
        self._ends.append((self.clock(), done))
        stop = self._why_stop(loss) or self._declined()
        if stop:
            self.stopped = stop
            self.model.stop_training = True

    def _why_stop(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return lr_nonfinite.cause(self.losses)  # "diverged" or "non-finite input"
        recent = float(np.median(self.losses[-RECENT:]))
        self._best = min(self._best, recent)
        past_start = len(self.losses) >= max(RECENT, self.num_steps // 10)
        if past_start and self._best > 0 and recent > self.stop_factor * self._best:
            return "diverged"
        if self.done >= self.num_steps:
            return "end of ramp"
        if self.budget_s is not None and self.clock() - self._began > self.budget_s:
            return "budget"
        return None

    def _declined(self) -> str | None:
        """At the first timed steps: "declined" when the ramp cannot fit (`lr_decline`)."""
        if len(self._ends) != 1 + lr_decline.TIMED:
            return None
        pairs = zip(self._ends[:-1], self._ends[1:], strict=True)
        step_s = min((b[0] - a[0]) / max(b[1] - a[1], 1) for a, b in pairs)
        elapsed, steps = self.clock() - self._began, self.num_steps
        self.declined = lr_decline.project(
            elapsed, self.done, step_s, steps, self.budget_s, self.job_steps, self.batch
        )
        return "declined" if self.declined else None


class _Ramped(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule × a multiplier: the range test ramps a schedule's base rate."""

    def __init__(
        self, schedule: keras.optimizers.schedules.LearningRateSchedule, multiplier: tf.Variable
    ) -> None:
        self.schedule, self.multiplier = schedule, multiplier

    def __call__(self, step: Any) -> Any:
        rate = self.schedule(step)
        return rate * tf.cast(self.multiplier, rate.dtype)

    def get_config(self) -> dict[str, Any]:
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule)}


class RateControl:
    """Sets an optimizer's rate for the range test and puts it back.

    A constant rate is assigned; a `LearningRateSchedule` is wrapped so that its base
    rate is ramped (each step's rate = the schedule's × rate / base) and put back after.
    A `LossScaleOptimizer` is looked through.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self.optimizer = getattr(optimizer, "inner_optimizer", optimizer)
        current = self.optimizer.learning_rate
        self.variable = current if isinstance(current, tf.Variable | keras.Variable) else None
        self.schedule = None
        if self.variable is not None:
            self.original = float(keras.ops.convert_to_numpy(current))
            return
        # Keras keeps a schedule only privately; it is set back through the public setter.
        schedule = self.optimizer._learning_rate
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise TypeError(
                f"The optimizer's learning rate is a {type(schedule).__name__}: the range "
                "test ramps a rate variable or a LearningRateSchedule's base rate."
            )
        self.schedule = schedule
        base = getattr(schedule, "initial_learning_rate", None)
        self.base = float(base if base is not None else schedule(0))
        self.multiplier = tf.Variable(1.0, trainable=False, dtype=tf.float32)
        self.optimizer.learning_rate = _Ramped(schedule, self.multiplier)

    def set(self, rate: float) -> None:
        """Trains the next steps at `rate` (the base rate of a schedule)."""
        if self.schedule is None:
            assert self.variable is not None  # no schedule: __init__ found a rate variable
            self.variable.assign(rate)
        else:
            self.multiplier.assign(rate / self.base)

    def restore(self) -> None:
        """Puts the rate (or the schedule) back; a traced step sees a multiplier of 1."""
        if self.schedule is None:
            assert self.variable is not None  # no schedule: __init__ found a rate variable
            self.variable.assign(self.original)
        else:
            self.multiplier.assign(1.0)
            self.optimizer.learning_rate = self.schedule


class _Snapshot:
    """The training state, written to a temporary checkpoint and read back."""

    def __init__(
        self,
        objects: Callable[[], dict[str, Any]],
        model: keras.Model,
        trainer: Trainer | None = None,
    ) -> None:
        self.objects, self.model, self.trainer = objects, model, trainer  # objects: a callable
        self.dir = tempfile.TemporaryDirectory(prefix="tfaccel-lr-")
        self.path = None
        self.unbuilt: list = []
        self.random = (random.getstate(), np.random.get_state())
        self.history = getattr(model, "history", None)
        self.settings = dict(getattr(trainer, "settings", {}) or {}) if trainer else None

    def take(self) -> None:
        """Writes the checkpoint: called once every variable exists (`on_train_begin`)."""
        metrics = [m for m in self.model.metrics if not m.variables]
        self.unbuilt = metrics  # built during the test: reset afterwards
        self.checkpoint = tf.train.Checkpoint(**self.objects())
        self.path = self.checkpoint.write(os.path.join(self.dir.name, "state"))
        self.seeds = [(v, v.numpy()) for v in _seed_states(self.model)]

    def restore(self) -> None:
        """Reads it back and resets what it cannot hold."""
        if self.path is not None:
            self.checkpoint.read(self.path).expect_partial()
        for variable, value in getattr(self, "seeds", ()):  # Dropout, noise, augmentation
            variable.assign(value)
        for metric in self.unbuilt:
            metric.reset_state()
        random.setstate(self.random[0])
        np.random.set_state(self.random[1])
        if self.history is not None:
            self.model.history = self.history
        if self.trainer is not None:
            assert self.settings is not None  # copied in __init__ whenever a trainer is given
            self.trainer.settings = self.settings
        self.dir.cleanup()


def _seed_states(model: keras.Model) -> list:
    """Every `keras.random.SeedGenerator` state of the model's layers (Dropout,
    GaussianNoise, random augmentation): the checkpoint does not hold them."""
    return [v for v in model.variables if v.name == "seed_generator_state"]


def _target(
    target: Trainer | keras.Model,
) -> tuple[keras.Model, Any, Callable[[], dict[str, Any]], Trainer | None]:
    """(model, optimizer, checkpoint objects, trainer or None) of a Trainer or compiled model."""
    if isinstance(target, keras.Model):
        if getattr(target, "optimizer", None) is None or not getattr(target, "compiled", True):
            raise ValueError(
                "find_learning_rate needs a compiled model (model.compile(optimizer, loss)) "
                "or a tfaccel.Trainer."
            )
        if not target.built:
            raise ValueError("Build the model first (an Input layer, or call it on a batch).")

        def objects() -> dict[str, Any]:
            return {
                "model": target,
                "optimizer": target.optimizer,
                "metrics": {m.name: list(m.variables) for m in target.metrics},
            }

        return target, target.optimizer, objects, None
    if not hasattr(target, "checkpoint_objects") or not hasattr(target, "fit"):
        raise TypeError(
            f"find_learning_rate takes a tfaccel.Trainer or a compiled keras.Model, "
            f"got {type(target).__name__}."
        )

    def trainer_objects() -> dict[
        str, Any
    ]:  # once the Trainer has built its state (its fit's start)
        out = dict(target.checkpoint_objects())
        source = getattr(target, "source_model", None)
        if source is not None and source is not target.model:
            out["source_model"] = source  # the Trainer copies its weights back at fit's end
        return out

    return target.model, target.optimizer, trainer_objects, target


def _batches(data: Any, y: Any, batch_size: int | None) -> int | None:
    """How many batches one pass over the data gives (None when unknown)."""
    if isinstance(data, tf.data.Dataset):
        n = int(data.cardinality())
        return n if n >= 0 else None
    if isinstance(data, np.ndarray | list | tuple | dict) and y is not None:
        first = next(iter(data.values())) if isinstance(data, dict) else data
        first = first[0] if isinstance(first, list | tuple) else first
        return math.ceil(len(first) / (batch_size or 32))
    return None


def _build_optimizer(model: keras.Model, trainer: Trainer | None) -> None:
    """As `model.fit` would: a compiled model's optimizer slots exist before the snapshot."""
    if trainer is None and not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)


def _check_budget(budget_s: float | None) -> None:
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be positive (or None), got {budget_s}.")


def find_learning_rate(
    target: Trainer | keras.Model,
    data: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    ramp: LRRamp | None = None,
    budget_s: float | None = None,
    job_examples: int | None = None,
    verbose: int = 0,
    **ramp_fields: Any,
) -> LearningRateReport:
    """Runs a learning-rate range test and suggests the rate to train at, or says why not.

    The rate is ramped exponentially from `min_lr` to `max_lr` over `num_steps` steps
    (one batch each) of `target`'s own fit; the curve is read by `lr_rule.suggest` (the
    largest rate still clearly descending, at most a third of the loss's minimum, or a
    third of that rate when the divergence is not seen; no suggestion when the curve is
    flat, too noisy, barely falls or diverges at once). Everything the
    test trained is put back (see the module): a fit after it equals one without it.

    Args:
        target: a `tfaccel.Trainer` (any number of replicas) or a compiled `keras.Model`.
        data: a batched `tf.data.Dataset` (or what `target.fit` takes), or features as
            arrays with `y`.
        y: labels, for array features.
        batch_size: the batch for arrays (default 32, as Keras).
        ramp: the ramp (`LRRamp`: `min_lr`, `max_lr`, `num_steps`, `stop_factor`);
            None: its defaults, from 1e-6 to 1.0 over 100 steps. The data must hold
            `num_steps` batches.
        budget_s: stop the ramp after this many seconds.
        job_examples: the job's size (epochs × examples), as `find_batch_size` takes: the
            ramp is then at most `lr_sizing.RAMP_SHARE` (5 %) of the job's steps, and
            below `lr_sizing.MIN_RAMP` steps nothing runs (no suggestion, reason "too
            small to pay"); and when its forward pass on one batch (before any step:
            `lr_decline.forward`, a Keras model only) or its first timed steps project the
            test past 5 % of the job's time (`lr_decline.PROBE_SHARE`), it stops there
            (stopped "declined", from what job size it runs).
        verbose: passed to `fit`.
        **ramp_fields: an `LRRamp`'s fields (`min_lr`, `max_lr`, `num_steps`,
            `stop_factor`), each replacing the one in `ramp`: e.g.
            `find_learning_rate(model, data, min_lr=1e-5, max_lr=10.0)`.

    Returns:
        A `LearningRateReport` (`suggestion`, `reason`, the curve, `plot()`, `to_dict()`).

    Raises:
        ValueError: the features or labels hold NaN or inf (`lr_inputs`: arrays before
            anything runs, a dataset's batch as it is read), the data holds fewer batches
            than `num_steps` (or ran out before enough points), the loss of the first
            batch is not finite (before any update: the model, not the rate), a bad
            range, or a model not compiled.
        TypeError: a target that is neither a Trainer nor a keras.Model, or a keyword
            that names no field of `LRRamp`.
    """
    (fields,) = keywords("find_learning_rate", ramp_fields, LRRamp)
    if ramp is None or fields:
        ramp = dataclasses.replace(ramp or LRRamp(), **fields)
    _check_budget(budget_s)
    num_steps = ramp.num_steps
    model, optimizer, objects, trainer = _target(target)
    data = lr_inputs.checked(data, y)  # NaN or inf inputs: a ValueError naming them
    job_steps = batch = None
    if job_examples is not None:
        lr_sizing.check_job_examples(job_examples)
        batch = lr_sizing.batch_of(data, y, batch_size)
        num_steps, needed, job_steps = lr_sizing.ramp_steps(job_examples, batch, num_steps)
        if num_steps < needed:
            return lr_sizing.not_run(num_steps, needed, job_steps, job_examples, batch)
        if trainer is None:
            with lr_inputs.named():
                early = lr_decline.forward(model, data, y, batch, num_steps, job_steps, budget_s)
            if early is not None:
                return early
    _build_optimizer(model, trainer)
    batches = _batches(data, y, batch_size)
    if batches is not None and batches < num_steps:
        raise ValueError(
            f"The data holds {batches} batches; the range test ramps the rate over "
            f"num_steps={num_steps} steps, one batch each. Pass more data (e.g. "
            f"dataset.repeat()) or fewer steps (num_steps={max(batches, lr_rule.MIN_POINTS)}; "
            f"at least {lr_rule.MIN_POINTS})."
        )
    snapshot = _Snapshot(objects, model, trainer)
    control = RateControl(optimizer)
    test = LRRangeTest(
        control, ramp.min_lr, ramp.max_lr, num_steps, budget_s, ramp.stop_factor, snapshot.take,
        job_steps=job_steps, batch=batch,
    )  # fmt: skip
    kwargs: dict[str, Any] = {"batch_size": batch_size} if y is not None else {}
    if trainer is None and isinstance(data, tf.data.Dataset):
        kwargs["shuffle"] = False  # Keras warns that a dataset is not shuffled by fit
    began = time.perf_counter()
    try:
        with lr_inputs.named():
            target.fit(
                data,
                y,
                epochs=1,
                steps_per_epoch=num_steps,
                callbacks=[test],
                verbose=verbose,
                **kwargs,
            )
    except TrainingDivergedError:  # the Trainer refuses non-finite weights at once
        test.rates.append(test.rate_at(test.done))
        test.losses.append(math.nan)
        test.stopped = lr_nonfinite.cause(test.losses)
    finally:
        control.restore()
        snapshot.restore()
    batch = batch or lr_sizing.assumed_batch(data, y, batch_size)  # the rate is for it
    return _report(test, control, time.perf_counter() - began, batch)


def _report(
    ramp: LRRangeTest, control: RateControl, seconds: float, batch: int | None = None
) -> LearningRateReport:
    if ramp.losses and not math.isfinite(ramp.losses[0]):
        raise ValueError(
            "The loss of the first batch is not finite: it is computed before any update, "
            "so the data or the model gives it at any rate (check the inputs and labels "
            "with tfaccel.data.check, and the model's output)."
        )
    if ramp.stopped == "data" and len(ramp.losses) < lr_rule.MIN_POINTS:
        raise ValueError(
            f"The data ran out after {ramp.done} steps: the range test needs at least "
            f"{lr_rule.MIN_POINTS} (num_steps={ramp.num_steps}); pass more data."
        )
    read = lr_rule.suggest(ramp.rates, ramp.losses)
    if ramp.stopped == "declined":
        assert ramp.declined is not None  # set with the reason whenever it stopped "declined"
        read = lr_rule.Suggestion(None, ramp.declined, [])
    elif ramp.stopped == lr_nonfinite.INPUT:
        read = lr_rule.Suggestion(None, lr_nonfinite.reason(ramp.rates, ramp.losses), [])
    elif ramp.stopped == "budget" and len(ramp.losses) < lr_rule.MIN_POINTS:
        why = (
            f"budget_s ran out after {ramp.done} steps: a curve needs at least "
            f"{lr_rule.MIN_POINTS}; raise budget_s"
        )
        read = lr_rule.Suggestion(None, why, [])
    elif len(ramp.losses) < min(ramp.done, lr_rule.MIN_POINTS):
        why = (
            f"the fit called the batch hooks once per loop of several steps ({len(ramp.losses)} "
            f"points for {ramp.done} steps): run the test with one step per loop "
            "(a Trainer with steps_per_loop='auto', which caps the loop for it, or 1)"
        )
        read = lr_rule.Suggestion(None, why, [])
    schedule = type(control.schedule).__name__ if control.schedule is not None else None
    return LearningRateReport(
        suggestion=read.rate,
        reason=read.reason,
        rates=list(ramp.rates),
        losses=list(ramp.losses),
        smoothed=list(read.smoothed),
        minimum_rate=read.minimum_rate,
        steepest_rate=lr_rule.steepest(ramp.rates, ramp.losses),
        noise=read.noise,
        stopped=ramp.stopped,
        steps=ramp.done,
        seconds=seconds,
        schedule=schedule,
        ramp_steps=ramp.num_steps,
        batch_size=batch,
    )
