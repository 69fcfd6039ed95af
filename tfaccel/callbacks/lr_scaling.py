"""LinearScalingWarmup: the linear scaling rule with gradual warm-up, per step."""

from __future__ import annotations

import keras

from tfaccel.callbacks._steps import StepClock, params_get, positive_int, to_float


def _innermost(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


class LinearScalingWarmup(keras.callbacks.Callback):
    """The linear scaling rule with gradual warm-up (Goyal et al., 2017), per step.

    The learning rate at global step `s` is `base_lr + (target - base_lr) * s / W`
    for `s < W`, where `target = base_lr * batch_size / base_batch_size` and
    `W = round(warmup_epochs * steps_per_epoch)`; from step `W` on it is `target`,
    set once and then left alone (so e.g. `ReduceLROnPlateau` can take over). With
    `steps_per_execution > 1` it changes once per execution. The value at each
    epoch end is added to the logs as `learning_rate`.

    The optimizer must hold its learning rate in a variable (a float
    `learning_rate`); a `LearningRateSchedule` cannot be set from outside.

    Args:
        base_lr: learning rate that works at `base_batch_size`.
        base_batch_size: batch size `base_lr` was tuned for.
        batch_size: global batch size used now.
        warmup_epochs: epochs (may be fractional) to ramp from `base_lr` to target.
        steps_per_epoch: steps per epoch; default `params["steps"]` from `fit`.

    Raises:
        ValueError: non-positive numbers, negative `warmup_epochs`, or (at the start
            of training) unknown steps per epoch.
        TypeError: (at the start of training) an optimizer whose learning rate is a
            schedule or callable.
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def __init__(
        self,
        base_lr: float,
        base_batch_size: int,
        batch_size: int,
        warmup_epochs: float = 5,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) or base_lr <= 0:
            raise ValueError(f"base_lr must be a positive number, got {base_lr!r}.")
        self.base_batch_size = positive_int("base_batch_size", base_batch_size)
        self.batch_size = positive_int("batch_size", batch_size)
        if (
            isinstance(warmup_epochs, bool)
            or not isinstance(warmup_epochs, (int, float))
            or warmup_epochs < 0
        ):
            raise ValueError(f"warmup_epochs must be a number >= 0, got {warmup_epochs!r}.")
        self.steps_per_epoch = positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
        self.base_lr = float(base_lr)
        self.warmup_epochs = warmup_epochs
        self.target_lr = self.base_lr * self.batch_size / self.base_batch_size

    def lr_at(self, step: int) -> float:
        """Returns the learning rate for global step `step` (needs steps per epoch)."""
        if step >= self._warmup_steps:
            return self.target_lr
        return self.base_lr + (self.target_lr - self.base_lr) * step / self._warmup_steps

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise RuntimeError(
                "LinearScalingWarmup needs a compiled model with an optimizer; call "
                "model.compile(optimizer=...) first."
            )
        inner = _innermost(optimizer)
        if not isinstance(getattr(inner, "_learning_rate", None), keras.Variable):
            raise TypeError(
                f"LinearScalingWarmup cannot set the learning rate of {type(inner).__name__}: "
                "it was created with a LearningRateSchedule (or callable), which is not "
                "settable. Either pass a float learning_rate to the optimizer (the warm-up then "
                "ends at the scaled rate and stays there), or fold the warm-up into your "
                "schedule (e.g. keras.optimizers.schedules.CosineDecay(warmup_steps=..., "
                "warmup_target=...)) and drop this callback."
            )
        per_epoch = self.steps_per_epoch or params_get(self, "steps")
        if not per_epoch:
            raise ValueError(
                "LinearScalingWarmup needs the number of steps per epoch, but params has no "
                "'steps' (a dataset of unknown length?). Pass steps_per_epoch=... to the "
                "callback (or to fit)."
            )
        self._per_epoch = int(per_epoch)
        self._warmup_steps = max(round(self.warmup_epochs * self._per_epoch), 0)
        self._optimizer = optimizer
        self._clock = StepClock()
        self._started = False
        self._handed_over = False

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if not self._started:  # resume from initial_epoch
            self._started = True
            self._clock.steps = int(epoch) * self._per_epoch
        self._clock.start_epoch()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        step = self._clock.steps
        if step < self._warmup_steps:
            self._optimizer.learning_rate = self.lr_at(step)
        elif not self._handed_over:
            self._optimizer.learning_rate = self.target_lr
            self._handed_over = True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._started = True
        self._clock.advance(batch, logs, self.params)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = to_float(self._optimizer.learning_rate)
