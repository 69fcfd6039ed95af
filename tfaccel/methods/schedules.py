"""Learning-rate schedules sized to the job: one-cycle and warmup-then-cosine.

Both are Keras' `keras.optimizers.schedules.CosineDecay` with a linear warmup, sized
to the job's steps (`epochs * steps_per_epoch`) and its batch; the schedule reads the
optimizer's `iterations`, so a resumed run (whose optimizer is restored) is at the same
point of it.

- `WarmupCosine(peak, warmup=0.05)`: 0 → peak linearly over the first 5 % of the steps,
  then a cosine down to `final * peak` at the last step.
- `OneCycle(peak, warmup=0.3)`: `peak / div` → peak over the first 30 %, then a cosine
  down to `peak / (div * final_div)` (Smith's one-cycle, with a cosine annealing).

The peak defaults to the optimizer's learning rate × `sqrt(batch / 32)` × `scale`
(`scale` 3 for one-cycle, 1 for warmup-cosine): the square-root rule adaptive
optimizers follow when the batch grows.
"""

from __future__ import annotations

import math

import keras

from tfaccel.methods.base import Job, Method, Plan, learning_rate_of

REFERENCE_BATCH = 32


def _check_fraction(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a fraction of the job in [0, 1), got {value!r}.")
    return float(value)


class _Schedule(Method):
    """Shared sizing: the job's steps, the peak rate, the schedule's length check."""

    stateful = "the position is the optimizer's iterations: checkpointed with it"
    scale = 1.0

    def __init__(self, peak, warmup, steps):
        if peak is not None and (isinstance(peak, bool) or not peak > 0):
            raise ValueError(f"{type(self).__name__} peak must be a positive rate, got {peak!r}.")
        if steps is not None and (isinstance(steps, bool) or int(steps) != steps or steps < 2):
            raise ValueError(f"{type(self).__name__} steps must be an integer >= 2, got {steps!r}.")
        self.peak = None if peak is None else float(peak)
        self.warmup = _check_fraction(warmup, f"{type(self).__name__} warmup")
        self.steps = None if steps is None else int(steps)
        self.schedule = None  # the Keras schedule of the last plan

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

    def make(self, job: Job) -> keras.optimizers.schedules.CosineDecay:
        """The Keras schedule sized to `job`."""
        raise NotImplementedError

    def apply(self, plan: Plan) -> None:
        """The optimizer's learning rate becomes the schedule (kept as `self.schedule`)."""
        self.schedule = self.make(plan.job)
        plan.rebuild_optimizer(learning_rate=self.schedule)

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

    def __init__(self, peak=None, warmup=0.05, final=0.0, steps=None):
        super().__init__(peak, warmup, steps)
        self.final = _check_fraction(final, "WarmupCosine final")

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the learning rate: warmup over {self.warmup:.0%} of the steps, then cosine"

    def make(self, job: Job):
        """The Keras `CosineDecay` with warmup, sized to `job`."""
        warmup, decay = self.sizes(job)
        peak = self.peak_for(job)
        return keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=0.0 if warmup else peak,
            decay_steps=decay,
            alpha=self.final,
            warmup_target=peak if warmup else None,
            warmup_steps=warmup,
        )


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

    def __init__(self, peak=None, warmup=0.3, div=25.0, final_div=1e4, steps=None, scale=3.0):
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

    def make(self, job: Job):
        """The Keras `CosineDecay` with warmup, sized to `job`."""
        warmup, decay = self.sizes(job)
        peak = self.peak_for(job)
        return keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=peak / self.div if warmup else peak,
            decay_steps=decay,
            alpha=1.0 / (self.div * self.final_div),
            warmup_target=peak if warmup else None,
            warmup_steps=warmup,
        )
