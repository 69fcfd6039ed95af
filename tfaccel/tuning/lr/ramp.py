"""`LRRamp`: the range test's ramp — its rates, its length, and when it stops for divergence.

Example:
    >>> ramp = tfaccel.tuning.LRRamp(min_lr=1e-5, max_lr=10.0, num_steps=60)  # doctest: +SKIP
    >>> report = tfaccel.tuning.find_learning_rate(model, data, ramp=ramp)
"""

from __future__ import annotations

import dataclasses
import math

from tfaccel.tuning.lr import rule as lr_rule


@dataclasses.dataclass(frozen=True)
class LRRamp:
    """The learning-rate range test's ramp: from `min_lr` to `max_lr`, exponentially, one
    rate a step for `num_steps` steps, stopped once the loss exceeds `stop_factor` × its
    lowest.

    Attributes:
        min_lr: the ramp's first rate (with a schedule: its base rate).
        max_lr: the ramp's last rate.
        num_steps: steps of the ramp (at least `lr_rule.MIN_POINTS`); the data must hold
            that many batches.
        stop_factor: stop when the loss exceeds this multiple of its lowest.

    Raises:
        ValueError: not 0 < `min_lr` < `max_lr` < inf, `num_steps` below
            `lr_rule.MIN_POINTS`, or `stop_factor` <= 1.
        TypeError: `num_steps` is not an integer.
    """

    min_lr: float = 1e-6
    max_lr: float = 1.0
    num_steps: int = 100
    stop_factor: float = 4.0

    def __post_init__(self) -> None:
        min_lr, max_lr, num_steps = self.min_lr, self.max_lr, self.num_steps
        if not (0 < min_lr < max_lr) or not math.isfinite(max_lr):
            raise ValueError(f"Need 0 < min_lr < max_lr, got min_lr={min_lr}, max_lr={max_lr}.")
        if isinstance(num_steps, bool) or not isinstance(num_steps, int):
            raise TypeError(f"num_steps must be an integer, got {num_steps!r}.")
        if num_steps < lr_rule.MIN_POINTS:
            raise ValueError(
                f"num_steps={num_steps} is too few for a curve: at least {lr_rule.MIN_POINTS}."
            )
        if self.stop_factor <= 1:
            raise ValueError(f"stop_factor must be above 1, got {self.stop_factor}.")
