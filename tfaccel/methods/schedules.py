"""Learning-rate schedules sized to the job: one-cycle and warmup-then-cosine.

Both are Keras' `CosineDecay` with a linear warmup (`Cycle`), sized to the job's steps
(`epochs * steps_per_epoch`, or the progressive batch's count) and its batch.

- `WarmupCosine(peak, warmup=0.05)`: 0 → peak linearly over the first 5 % of the steps,
  then a cosine down to `final * peak` at the last step.
- `OneCycle(peak, warmup=0.3)`: `peak / div` → peak over the first 30 %, then a cosine
  down to `peak / (div * final_div)` (Smith's one-cycle, with a cosine annealing).

The peak defaults to the optimizer's learning rate × `sqrt(batch / 32)` × `scale`
(`scale` 3 for one-cycle, 1 for warmup-cosine): the square-root rule adaptive
optimizers follow when the batch grows.

Each `fit` gets a cycle of its own (`FitClock`): the cycle's position is the fit's epoch
and step, read against the optimizer's `iterations` (checkpointed with it). A resumed run
continues its cycle; a later `fit` of the same model starts a new one sized to its own
steps; a step Keras counts past the end of an epoch of unknown length moves nothing.

While a fit runs, a callback setting `optimizer.learning_rate` (`ReduceLROnPlateau`, any)
multiplies the cycle by `new / current` from then on (`ComposedRate`, `Cycle.rescale`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, ClassVar

import keras
import tensorflow as tf

from tfaccel.callbacks._steps import user_stacklevel
from tfaccel.methods.base import Card, Job, Method, MethodPlan, learning_rate_of, schedule_of

REFERENCE_BATCH = 32


def _check_fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a fraction of the job in [0, 1), got {value!r}.")
    return float(value)


@keras.saving.register_keras_serializable("tfaccel")
class Cycle(keras.optimizers.schedules.LearningRateSchedule, tf.__internal__.tracking.Trackable):
    """Keras' `CosineDecay` with warmup, its steps counted from `start`: `initial` up to
    `peak` linearly over `warmup` steps, then a cosine down to `alpha * peak` over `decay`
    steps, held there after; times `callback_factor`.

    The sizes and `start` are variables, so a later `fit` sizes it anew (`size`) without
    retracing the step that reads it. They are not checkpointed: `FitClock` sets them
    at each fit from the fit's position. `callback_factor` (1 until a callback sets the
    rate, `ComposedRate`) is training state: the optimizer holding the cycle tracks it
    from a fit's start (`keep_factor`), so the Trainer's checkpoints save and restore it;
    `get_config` leaves it out (a config is the schedule as made, and `model.save` starts
    a loaded model's factor at 1).
    """

    def __init__(
        self, initial: float, peak: float, warmup: float, decay: float, alpha: float = 0.0
    ):
        self.alpha = float(alpha)
        self.sizes = tf.Variable(
            [initial, peak, warmup, decay], dtype=tf.float32, trainable=False, name="cycle"
        )
        self.start = tf.Variable(0, dtype=tf.int64, trainable=False, name="cycle_start")
        self.callback_factor = tf.Variable(
            1.0, dtype=tf.float32, trainable=False, name="cycle_callback_factor"
        )

    def keep_factor(self) -> None:
        """Puts `callback_factor` in the optimizer's checkpoints: at a fit's start (after
        the Trainer's restore) and before a rate is set, so a checkpoint written without
        it still resumes and one holding it gives its value now (a deferred restore)."""
        if self._lookup_dependency("callback_factor") is None:
            self._track_trackable(self.callback_factor, name="callback_factor", overwrite=True)

    def size(self, initial: float, peak: float, warmup: float, decay: float) -> None:
        """The cycle's new rates and lengths (steps)."""
        self.sizes.assign([initial, peak, warmup, decay])

    def shape_at(self, step: Any) -> Any:
        """The cycle's rate at `step` before `callback_factor`."""
        initial, peak, warmup, decay = tf.unstack(tf.convert_to_tensor(self.sizes))
        done = tf.cast(tf.cast(step, tf.int64) - tf.convert_to_tensor(self.start), tf.float32)
        done = tf.clip_by_value(done, 0.0, warmup + decay)
        rising = initial + (peak - initial) * tf.math.divide_no_nan(done, warmup)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * (done - warmup) / decay))
        falling = peak * ((1.0 - self.alpha) * cosine + self.alpha)
        return tf.where(done < warmup, rising, falling)

    def __call__(self, step: Any) -> Any:
        return self.shape_at(step) * tf.convert_to_tensor(self.callback_factor)

    def rescale(self, rate: float, current: float, step: Any) -> None:
        """A callback set the rate to `rate` where the optimizer's is `current` (at
        `step`): the factor becomes factor x rate / current. Where the rate is 0 (a
        warm-up's start) and `rate` is not, nothing can be multiplied: said, not done."""
        old = float(self.callback_factor.numpy())
        if rate == current:
            return
        if current:
            self.callback_factor.assign(old * rate / current)
            return
        base = float(keras.ops.convert_to_numpy(self.shape_at(step)))
        if old == 0 and base != 0:  # a rate set to 0 before, set again
            self.callback_factor.assign(rate / base)
            return
        warnings.warn(
            f"A callback set the learning rate to {rate:g} where the schedule's rate is 0 "
            "(its warm-up starts at 0): no factor scales 0, so the rate is unchanged. Set "
            "rates relative to the current one (e.g. lr * 0.5), or use OneCycle.",
            stacklevel=user_stacklevel(),
        )

    def get_config(self) -> dict:
        initial, peak, warmup, decay = (float(v) for v in self.sizes.numpy())
        return dict(initial=initial, peak=peak, warmup=warmup, decay=decay, alpha=self.alpha)


def driving_cycle(optimizer: Any) -> Cycle | None:
    """The `Cycle` that drives `optimizer`'s rate (looking through loss scaling): its
    schedule, or the one another schedule wraps (`FitClock` names it `tfaccel_cycle`: the
    progressive batch's scaling); None without one."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    rate = getattr(inner, "_learning_rate", None)
    if isinstance(rate, Cycle):
        return rate
    wrapped = getattr(inner, "tfaccel_cycle", None)
    schedule = keras.optimizers.schedules.LearningRateSchedule
    return wrapped if isinstance(rate, schedule) and isinstance(wrapped, Cycle) else None


def _set_rate(optimizer: Any, value: Any, setter: Any) -> None:
    """`ComposedRate`'s `learning_rate` setter: a number rescales the driving `Cycle`;
    anything else (a schedule, a callable, a rate of another optimizer) goes to `setter`,
    the optimizer class's own."""
    cycle = driving_cycle(optimizer)
    schedule = keras.optimizers.schedules.LearningRateSchedule
    if cycle is not None and not isinstance(value, schedule) and not callable(value):
        cycle.keep_factor()  # first: a restored factor is the current one's
        current = float(keras.ops.convert_to_numpy(optimizer._get_current_learning_rate()))
        rate = float(keras.ops.convert_to_numpy(value))
        cycle.rescale(rate, current, optimizer._iterations)
        return
    setter(optimizer, value)


def _set_class(optimizer: Any, cls: type) -> None:
    object.__dict__["__class__"].__set__(optimizer, cls)


class ComposedRate:
    """Lets the user's callbacks set the rate of an optimizer driven by a `Cycle`.

    Keras refuses to set the rate of an optimizer made with a schedule. While a fit runs,
    `FitClock` makes the optimizer (inside loss scaling) an instance of a subclass of its
    class whose `learning_rate` setter rescales the cycle; the getter is Keras'. Its
    `__class__` is the optimizer's own (serialization, names, `isinstance` unchanged); the
    fit's end gives the class back. Nothing global changes.
    """

    _made: ClassVar[dict[type, type]] = {}

    @classmethod
    def subclass(cls, base: Any) -> type:
        """The composing subclass of optimizer class `base` (made once)."""
        made = cls._made.get(base)
        if made is None:
            own = base.learning_rate  # Keras' property, or the class's override of it
            made = type(
                base.__name__,
                (base,),
                {
                    "learning_rate": property(own.fget, lambda o, v: _set_rate(o, v, own.fset)),
                    "__class__": property(lambda self: base, _set_class),
                    "__module__": base.__module__,
                    "__qualname__": base.__qualname__,
                    "__doc__": base.__doc__,
                },
            )
            cls._made[base] = made
        return made

    @classmethod
    def on(cls, optimizer: Any) -> None:
        """Makes `optimizer`'s rate settable by callbacks (when a `Cycle` drives it)."""
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if driving_cycle(inner) is not None:
            if type(inner) not in cls._made.values():
                _set_class(inner, cls.subclass(type(inner)))

    @classmethod
    def off(cls, optimizer: Any) -> None:
        """Gives `optimizer` its own class back."""
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if type(inner) in cls._made.values():
            _set_class(inner, inner.__class__)


class FitClock(keras.callbacks.Callback):
    """Keeps a schedule's `Cycle` at the position of the fit in progress.

    At a fit's start, a job of other epochs, steps or batch than the cycle's (a later
    `fit`) gets a cycle sized to it. At each epoch's start (and at its first batch when
    that is not batch 0: a resumed epoch), the cycle's start becomes the optimizer's step
    count less the steps the job makes before that batch. From `set_model` to the fit's
    end callbacks may set the rate (`ComposedRate`); each epoch logs `learning_rate`.
    """

    loop_batches_ok = True  # no per-step hook: the Trainer's loops keep their size

    def __init__(self, method: _Schedule):
        super().__init__()
        self.method = method
        self._epoch: int | None = None

    def _align(self, epoch: int, batch: int) -> None:
        optimizer = self.model.optimizer
        iterations = getattr(optimizer, "inner_optimizer", optimizer).iterations
        self.method.align(iterations, epoch, batch)

    def _compose(self) -> None:
        """Callbacks may set the rate; a cycle another schedule wraps (the progressive
        batch's scaling) is named `tfaccel_cycle` on the optimizer, which so tracks it."""
        optimizer, cycle = getattr(self.model, "optimizer", None), self.method.schedule
        if optimizer is None or cycle is None:
            return
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if schedule_of(inner) is not None and schedule_of(inner) is not cycle:
            inner.tfaccel_cycle = cycle  # tracked, as the schedule itself is
        ComposedRate.on(inner)

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._compose()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._compose()
        if self.method.schedule is not None:
            self.method.schedule.keep_factor()
        self.method.refit(self.params or {})

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._align(epoch, 0)
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._epoch is not None and batch:
            self._align(self._epoch, batch)
        self._epoch = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and "learning_rate" not in logs:
            rate = self.model.optimizer.learning_rate
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))

    def on_train_end(self, logs: dict | None = None) -> None:
        ComposedRate.off(self.model.optimizer)


class _Schedule(Method):
    """Shared sizing: the job's steps, the peak rate, the schedule's length check."""

    stateful = "the position is the fit's epoch and step, read on the optimizer's iterations"
    scale = 1.0

    def __init__(self, peak: float | None, warmup: float, steps: int | None):
        if peak is not None and (isinstance(peak, bool) or not peak > 0):
            raise ValueError(f"{type(self).__name__} peak must be a positive rate, got {peak!r}.")
        if steps is not None and (isinstance(steps, bool) or int(steps) != steps or steps < 2):
            raise ValueError(f"{type(self).__name__} steps must be an integer >= 2, got {steps!r}.")
        self.peak = None if peak is None else float(peak)
        self.warmup = _check_fraction(warmup, f"{type(self).__name__} warmup")
        self.steps = None if steps is None else int(steps)
        self.schedule: Cycle | None = None  # the schedule of the last plan
        self._job: Job | None = None  # the job it is sized to (the fit in progress)

    def check(self, job: Job) -> None:
        if self.steps is not None and self.steps > job.total_steps:
            raise ValueError(
                f"{type(self).__name__} was given steps={self.steps}, longer than the job "
                f"({job.epochs} epochs x {job.steps_per_epoch} steps = {job.total_steps}): "
                "the rate would never finish its decay. Leave steps=None to size it to the "
                "job, or give at most the job's steps."
            )
        if job.total_steps < 2:
            raise ValueError(f"{type(self).__name__} needs a job of at least 2 steps.")

    def peak_for(self, job: Job) -> float:
        """The peak rate: given, or the optimizer's rate x sqrt(batch / 32) x scale."""
        if self.peak is not None:
            return self.peak
        batch = job.batch_size or REFERENCE_BATCH
        return learning_rate_of(job.optimizer) * math.sqrt(batch / REFERENCE_BATCH) * self.scale

    def shape(self, job: Job) -> tuple[float, float, int, int, float]:
        """(initial rate, peak, warmup steps, decay steps, alpha) for `job`."""
        raise NotImplementedError

    def make(self, job: Job) -> Cycle:
        """The schedule sized to `job`."""
        return Cycle(*self.shape(job))

    def apply(self, plan: MethodPlan) -> None:
        """The optimizer's learning rate becomes the schedule (kept as `self.schedule`);
        a schedule the optimizer had is replaced, and the plan says so."""
        self._job = plan.job
        self.schedule = self.make(plan.job)
        given = schedule_of(plan.optimizer)
        if given is not None:
            plan.dropped.append(
                (
                    "learning-rate schedule",
                    f"the optimizer's {type(given).__name__} is replaced by {self.name}",
                )
            )
        plan.rebuild_optimizer(learning_rate=self.schedule)
        plan.callbacks.append(FitClock(self))

    def refit(self, params: dict) -> None:
        """Sizes the schedule to the fit about to run (Keras' callback `params`: epochs,
        steps, batch_size) when its job differs from the one sized to: a later `fit`. A
        fit of unknown steps (the progressive batch's) keeps the plan's count."""
        job, epochs, steps = self._job, params.get("epochs"), params.get("steps")
        if job is None or self.schedule is None or not epochs or not steps or job.epoch_steps:
            return
        batch = params.get("batch_size") or job.batch_size
        if (epochs, steps, batch) == (job.epochs, job.steps_per_epoch, job.batch_size):
            return
        self._job = dataclasses.replace(job, epochs=epochs, steps_per_epoch=steps, batch_size=batch)
        self.schedule.size(*self.shape(self._job)[:4])
        if self.steps is not None and self.steps > self._job.total_steps:
            warnings.warn(
                f"{type(self).__name__}(steps={self.steps}) is longer than this fit "
                f"({self._job.total_steps} steps): its cycle restarts and will not finish "
                "its decay. Give steps=None to size it to each fit.",
                stacklevel=user_stacklevel(),
            )

    def align(self, iterations: Any, epoch: int, batch: int) -> None:
        """Starts the cycle `iterations` (the optimizer's step count) less the job's steps
        before `batch` of `epoch`."""
        job, schedule = self._job, self.schedule
        assert job is not None and schedule is not None, "FitClock aligns an applied schedule"
        done = job.steps_before(epoch) + int(batch)
        schedule.start.assign(tf.cast(iterations, tf.int64) - done)

    def sizes(self, job: Job) -> tuple[int, int]:
        """(warmup steps, decay steps) for `job`."""
        total = self.steps or job.total_steps
        warmup = int(round(self.warmup * total))
        return warmup, max(total - warmup, 1)


class WarmupCosine(_Schedule):
    """Linear warmup from 0 to `peak`, then cosine decay to `final * peak` at the last step.

    Args:
        peak: the highest rate; None: the optimizer's rate x sqrt(batch / 32).
        warmup: the share of the steps spent warming up, in [0, 1).
        final: the last rate as a share of the peak.
        steps: the schedule's length; None: the job's steps (`epochs * steps_per_epoch`).

    Raises:
        ValueError: a bad peak / warmup / steps; at `check`, steps longer than the job.
    """

    name = "warmup-cosine"
    card = Card(
        changes=(
            "the learning rate: 0 up to the peak over the first `warmup` of the steps, then a "
            "cosine down to `final` × the peak, sized to the job's steps; the peak the "
            "optimizer's rate × `sqrt(batch / 32)` unless given"
        ),
        helps="with a `peak=` above the optimizer's rate (e.g. 3e-3 for Adam; not measured here)",
        hurts=(
            "the default peak, Adam's rate, is too low for a decaying schedule; sized to the "
            "declared epochs, so a run stopped early by a target sees only its start; replaces "
            "the optimizer's own schedule (the plan says so)"
        ),
        measured=(
            "With Adam's default rate as its peak: reached the digits CNN's target in 2 of 5 "
            "seeds and never the GRU's."
        ),
        defaults="warmup=0.05, final=0 (not set by a measurement here)",
        measured_as="WarmupCosine()",
        contender="warmup_cosine",
        results=("time_to_accuracy.json",),
    )

    def __init__(
        self,
        peak: float | None = None,
        warmup: float = 0.05,
        final: float = 0.0,
        steps: int | None = None,
    ):
        super().__init__(peak, warmup, steps)
        self.final = _check_fraction(final, "WarmupCosine final")

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the learning rate: warmup over {self.warmup:.0%} of the steps, then cosine"

    def shape(self, job: Job) -> tuple[float, float, int, int, float]:
        """(initial rate, peak, warmup steps, decay steps, alpha) for `job`."""
        warmup, decay = self.sizes(job)
        peak = self.peak_for(job)
        return 0.0 if warmup else peak, peak, warmup, decay, self.final


class OneCycle(_Schedule):
    """One cycle: `peak / div` up to `peak` (warmup), then cosine down to `peak / (div *
    final_div)`.

    Args:
        peak: the highest rate; None: `scale` x the optimizer's rate x sqrt(batch / 32).
        warmup: the share of the steps rising, in [0, 1) (0.3 as in Smith's paper).
        div: peak / starting rate.
        final_div: starting rate / last rate.
        steps: the schedule's length; None: the job's steps.
        scale: the peak over the optimizer's rate when `peak` is None (3: Smith's range).

    Raises:
        ValueError: a bad peak / warmup / steps / div / scale; at `check`, steps longer
            than the job.
    """

    name = "one-cycle"
    scale = 3.0
    card = Card(
        changes=(
            "the learning rate: one cycle, `peak / div` up to the peak over the first "
            "`warmup` of the steps, then a cosine down, sized to the job's steps; the peak "
            "`scale`× the optimizer's rate × `sqrt(batch / 32)`"
        ),
        helps=(
            "short jobs at Adam's rate: the best single method on the digits CNN and GRU, "
            'the core of `"fast"`'
        ),
        hurts=(
            "a high peak on a long job (at 10× a GRU of 6,250 steps diverged at the peak) or "
            "a short table (10× overshot the breast-cancer MLP's target); sized to the "
            "declared epochs, so a run stopped early by a target sees only its start; "
            "replaces the optimizer's own schedule (the plan says so)"
        ),
        measured=(
            "Alone at 3×: epochs 0.67× (CNN), 1.50× (ResNet), 0.62× (GRU), 1.00× (table); "
            "time 0.73×, 1.02×, 0.76×, 1.01×. On the CIFAR-shaped CNN of minutes 0.99× "
            "(epochs 1.00×, final 0.971 vs 0.960); on the generated table 0.66× [0.58, 0.85] "
            "(epochs 0.69×); on the breast-cancer MLP (390 steps) 0.97× [0.87, 1.05], 1.12× "
            "with 3× the epochs declared and a stop at the target. At 10× the GRU of the "
            "CIFAR-shaped rows (6,250 steps) fell from 0.68 held-out accuracy to 0.39 as the "
            "rate peaked, on every seed of a three-seed screen."
        ),
        defaults=(
            "warmup=0.3 and scale=3 from Smith's one-cycle; `\"fast\"`'s 10× (images, "
            "sequences under 2,000 steps) and 3× (a grown batch) from time_to_accuracy.json"
        ),
        measured_as="OneCycle()",
        contender="one_cycle",
        results=("time_to_accuracy.json",),
    )

    def __init__(
        self,
        peak: float | None = None,
        warmup: float = 0.3,
        div: float = 25.0,
        final_div: float = 1e4,
        steps: int | None = None,
        scale: float = 3.0,
    ):
        super().__init__(peak, warmup, steps)
        if isinstance(scale, bool) or not scale > 0:
            raise ValueError(f"OneCycle scale must be a positive factor, got {scale!r}.")
        self.scale = float(scale)
        if not div >= 1 or not final_div >= 1:
            raise ValueError(f"OneCycle div and final_div must be >= 1, got {div}, {final_div}.")
        self.div, self.final_div = float(div), float(final_div)

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the learning rate: one cycle, rising over {self.warmup:.0%} of the steps"

    def shape(self, job: Job) -> tuple[float, float, int, int, float]:
        """(initial rate, peak, warmup steps, decay steps, alpha) for `job`."""
        warmup, decay = self.sizes(job)
        peak = self.peak_for(job)
        alpha = 1.0 / (self.div * self.final_div)
        return peak / self.div if warmup else peak, peak, warmup, decay, alpha
