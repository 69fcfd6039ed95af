"""A learning-rate schedule with no end date: a short warm-up, then a decay the loss drives.

`Plateau()` needs no declared length: the rate rises from `peak / div` to the peak over a
share of the *first epoch* (or `warmup_steps`), is held there, and is halved (`factor`)
each time the monitored loss (the validation loss when the epoch has one, else the
training loss) stalls for `patience` epochs, down to `min_factor` × the peak. Declaring 10
epochs or 150 gives the same rate at every step, so a run stopped early (`EarlyStopping`,
a stop at the target) follows the same path as one declared to its exact length.

The peak is the one-cycle's rule: the optimizer's rate × `sqrt(batch / 32)` × `scale`.
The rising part is `schedules.Cycle`'s warm-up, aligned to each fit's position by
`schedules.FitClock` (a resumed run continues it); the decay is a factor, `best` loss
and wait count held in variables of the schedule (`PlateauCycle`), which is tracked by
the optimizer and so saved in the Trainer's checkpoints: a resumed run keeps its decay.
A later `fit` of the same model warms up again to the peak times the factor reached.
Once a callback of the user's sets the rate (`ReduceLROnPlateau`: it multiplies the
schedule, `schedules.Cycle`'s callback factor), that callback drives the decay and
Plateau's own stands down.

Example:
    >>> plan = methods.for_fit([methods.Plateau(scale=10.0)], model, train,
    ...                        epochs=150, loss="sparse_categorical_crossentropy",
    ...                        optimizer=keras.optimizers.Adam())      # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from tfaccel.methods.base import Card, Job, MethodPlan, schedule_of
from tfaccel.methods.schedules import Cycle, _Schedule

# The cosine of a `Cycle` this long stays at its peak: the decay is the factor's alone.
NO_END = 1e12
MONITORS = ("auto", "loss", "val_loss")


@keras.saving.register_keras_serializable("tfaccel")
class PlateauCycle(Cycle, tf.Module):
    """`Cycle`'s warm-up held at its peak, times a `factor` the plateau decay lowers.

    The factor, the best loss seen and the epochs waited since are variables of this
    `tf.Module`, tracked by the optimizer holding it (its checkpoints save them).
    """

    def __init__(self, initial: float, peak: float, warmup: float, decay: float = NO_END):
        tf.Module.__init__(self, name="plateau")
        Cycle.__init__(self, initial, peak, warmup, NO_END)
        self.factor = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="plateau_factor")
        self.best = tf.Variable(math.inf, dtype=tf.float32, trainable=False, name="plateau_best")
        self.wait = tf.Variable(0, dtype=tf.int64, trainable=False, name="plateau_wait")

    def __call__(self, step: Any) -> Any:
        return Cycle.__call__(self, step) * tf.convert_to_tensor(self.factor)

    def get_config(self) -> dict:
        config = Cycle.get_config(self)
        config.pop("alpha")
        return config


class PlateauDecay(keras.callbacks.Callback):
    """At each epoch's end, lowers the schedule's factor when the loss has stalled."""

    loop_batches_ok = True  # no per-step hook

    def __init__(self, method: Plateau):
        super().__init__()
        self.method = method

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        value = self.method.monitored(logs or {})
        schedule = self.method.schedule
        if value is None or schedule is None or user_driven(schedule):
            return
        self.method.step(schedule, value)


def user_driven(schedule: PlateauCycle) -> bool:
    """Whether a callback of the user's (`ReduceLROnPlateau`, a scheduler) has set the rate:
    the `Cycle`'s callback factor is no longer 1. The user's callback then drives the decay,
    and Plateau's own stands down (the two would each lower the rate at a plateau)."""
    factor = getattr(schedule, "callback_factor", None)
    return factor is not None and float(factor.numpy()) != 1.0


class Plateau(_Schedule):
    """Warm-up over a share of the first epoch, then the rate halved when the loss stalls.

    Args:
        scale: the peak over the optimizer's rate × `sqrt(batch / 32)` (when `peak` is None).
        warmup: the share of the first epoch's steps rising to the peak, in [0, 1].
        warmup_steps: the steps rising instead (overrides `warmup`).
        factor: what the rate is multiplied by at a plateau, in (0, 1).
        patience: epochs without improvement before the rate falls.
        min_delta: the relative fall of the loss that counts as an improvement.
        min_factor: the lowest rate, as a share of the peak.
        monitor: "auto" (`val_loss` when the epoch has it, else `loss`), "loss" or "val_loss".
        peak: the peak rate itself.
        div: the peak over the warm-up's starting rate.

    Raises:
        ValueError: a bad value (the message says which and what is allowed).
    """

    name = "plateau"
    card = Card(
        changes=(
            "the learning rate: `peak / div` up to the peak over `warmup` of the first epoch, "
            "held, then multiplied by `factor` each time the loss stalls `patience` epochs; "
            "no end date, so the declared epochs change nothing"
        ),
        helps=(
            "runs declared longer than they need and stopped early (`EarlyStopping`, a target): "
            "its rate never reads the declared epochs, where a one-cycle sized to them is still "
            'warming up; `"fast"`\'s schedule for every kind'
        ),
        hurts=(
            "a job that reaches its target within the first epoch or two, which the warm-up "
            "over the first epoch slows (a `ReduceLROnPlateau` of the user's multiplies the rate "
            "and then drives the decay: Plateau's own stands down)"
        ),
        measured=(
            'In place of the one-cycle inside `"fast"`, declared 1×, 3× and 10× the epochs '
            "needed and stopped at the target (declared_length.json, a busy host; median "
            "epochs): 3, 3 and 3 on the digits CNN (one-cycle 3, 4, 5), 2, 2 and 2 on the "
            "CIFAR-shaped CNN (2, 4, 4), 3, 6 and 6 on the digits GRU (5, 7, 9), 7, 7 and 7 on "
            "the generated table (7, 8, 14); median time 0.85×, 0.63× and 0.56× the one-cycle's "
            "on the CIFAR-shaped CNN, 0.79×, 0.80× and 0.79× on the table (3 seeds)"
        ),
        defaults=(
            "patience=1 and factor=0.5: Keras' ReduceLROnPlateau's rule, made prompt; the "
            'scale is the caller\'s (`"fast"`: 10× for images and short sequences, 3× for '
            "long sequences and tables)"
        ),
        measured_as="Plateau()",
        results=("declared_length.json",),
    )

    def __init__(
        self,
        scale: float = 3.0,
        warmup: float = 1.0,
        warmup_steps: int | None = None,
        factor: float = 0.5,
        patience: int = 1,
        min_delta: float = 1e-3,
        min_factor: float = 1e-3,
        monitor: str = "auto",
        peak: float | None = None,
        div: float = 25.0,
    ):
        super().__init__(peak, 0.0, None)
        if not _number(scale) or not scale > 0:
            raise ValueError(f"Plateau scale must be a positive factor, got {scale!r}.")
        if not _number(div) or not div >= 1:
            raise ValueError(f"Plateau div must be a number >= 1, got {div!r}.")
        if not _number(warmup) or not 0 <= warmup <= 1:
            raise ValueError(
                f"Plateau warmup must be a share of the first epoch in [0, 1], got {warmup!r}."
            )
        if warmup_steps is not None and (
            isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0
        ):
            raise ValueError(f"Plateau warmup_steps must be an int >= 0, got {warmup_steps!r}.")
        for value, what in ((factor, "factor"), (min_factor, "min_factor")):
            if not _number(value) or not 0 < value < 1:
                raise ValueError(f"Plateau {what} must be in (0, 1), got {value!r}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"Plateau patience must be an int >= 1 (epochs), got {patience!r}.")
        if not _number(min_delta) or min_delta < 0:
            raise ValueError(f"Plateau min_delta must be >= 0, got {min_delta!r}.")
        if monitor not in MONITORS:
            raise ValueError(f"Plateau monitor must be one of {MONITORS}, got {monitor!r}.")
        self.scale, self.div = float(scale), float(div)
        self.warmup = float(warmup)
        self.warmup_steps = warmup_steps
        self.factor, self.patience = float(factor), patience
        self.min_delta, self.min_factor, self.monitor = float(min_delta), float(min_factor), monitor

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        warm = self._warmup_of(self._job) if self._job is not None else None
        steps = f"{warm} steps" if warm is not None else f"{self.warmup:.0%} of the first epoch"
        return (
            f"the learning rate: warm-up over {steps} to {self.scale:g}x the optimizer's rate "
            f"(x sqrt(batch / 32)), then x{self.factor:g} when the {self.monitor} loss stalls "
            f"{self.patience} epoch(s); no end date"
        )

    def check(self, job: Job) -> None:
        """Any job of at least one step fits: nothing is sized to its epochs."""

    def _warmup_of(self, job: Job) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round(self.warmup * job.steps_before(1)))

    def shape(self, job: Job) -> tuple[float, float, int, int, float]:
        """(initial rate, peak, warmup steps, decay steps, alpha): the first epoch's
        steps and the batch only, never the declared epochs."""
        warmup, peak = self._warmup_of(job), self.peak_for(job)
        return peak / self.div if warmup else peak, peak, warmup, int(NO_END), 0.0

    def make(self, job: Job) -> PlateauCycle:
        """The schedule for `job` (its factor at 1)."""
        return PlateauCycle(*self.shape(job)[:3])

    def apply(self, plan: MethodPlan) -> None:
        """The optimizer's rate becomes the schedule; `FitClock` aligns its warm-up and
        `PlateauDecay` lowers it at each epoch's end."""
        super().apply(plan)
        plan.callbacks.append(PlateauDecay(self))
        plan.finishers.append(self._tracked)

    def _tracked(self, plan: MethodPlan) -> None:
        """After every method: a schedule another method wrapped (the progressive batch's
        scaling) stays tracked by the final optimizer, so checkpoints still hold its decay."""
        if schedule_of(plan.optimizer) is not self.schedule:
            plan.optimizer.tfaccel_plateau = self.schedule

    def monitored(self, logs: dict) -> float | None:
        """The loss this epoch's `logs` give for `monitor` (None when absent)."""
        key = self.monitor
        if key == "auto":
            key = "val_loss" if "val_loss" in logs else "loss"
        value = logs.get(key)
        return None if value is None or not math.isfinite(float(value)) else float(value)

    def step(self, schedule: PlateauCycle, value: float) -> None:
        """One epoch's rule: a loss below `best` by `min_delta` (relative) resets the
        wait; `patience` epochs without one multiply the factor by `factor`."""
        best = float(schedule.best.numpy())
        if not math.isfinite(best) or value < best - self.min_delta * abs(best):
            schedule.best.assign(value)
            schedule.wait.assign(0)
            return
        waited = int(schedule.wait.numpy()) + 1
        if waited < self.patience:
            schedule.wait.assign(waited)
            return
        lowered = max(float(schedule.factor.numpy()) * self.factor, self.min_factor)
        schedule.factor.assign(lowered)
        schedule.wait.assign(0)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)
