"""The learning-rate scaling rule that goes with a change of batch size.

SGD (with or without momentum) scales linearly, with a warm-up (Goyal et al. 2017,
"Accurate, Large Minibatch SGD"; `callbacks.LinearScalingWarmup`). Adaptive optimizers
scale with the square root of the batch ratio (Malladi et al. 2022, "On the SDEs and
Scaling Rules for Adaptive Gradient Algorithms"; Hoffer et al. 2017 for the same rule):
a linear rule overshoots Adam, whose update size does not grow with the gradient's.

`LRScaling` holds one such rule with the batch and rate it scales from
(`BatchSizeHyperModel(scaling=...)`, or its fields as keywords).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from tfaccel.errors import LRScalingWarning

LR_SCALING_RULES = ("auto", "linear", "sqrt", None)
# Optimizers whose step is normalised by running gradient statistics: square-root rule.
ADAPTIVE = (
    "Adam",
    "AdamW",
    "Adamax",
    "Nadam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Adafactor",
    "Lamb",
    "Lion",
    "Ftrl",
    "ScheduleFreeAdamW",
)


def check_lr_scaling(rule: str | None) -> None:
    """Raises ValueError unless `rule` is "auto", "linear", "sqrt" or None."""
    if rule not in LR_SCALING_RULES:
        raise ValueError(
            f"Unknown lr_scaling {rule!r}. Expected 'auto' (from the optimizer), 'linear' "
            "(rate ∝ batch), 'sqrt' (rate ∝ √batch) or None (keep the base rate)."
        )


def rule_for(optimizer: Any) -> str:
    """ "sqrt" for adaptive optimizers (Adam, AdamW, RMSprop...), "linear" for SGD.

    `optimizer` is an optimizer, its class or its name; loss scaling is looked through.
    The class hierarchy decides (a subclass of Adam gets Adam's rule). Anything else
    gets "linear" with an `LRScalingWarning` saying why.
    """
    import keras

    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, str):
        try:
            inner = keras.optimizers.get(inner)
        except ValueError:
            return _unknown(f"{inner!r} is not a Keras optimizer name")
    cls = inner if isinstance(inner, type) else type(inner)
    adaptive = tuple(getattr(keras.optimizers, n) for n in ADAPTIVE if hasattr(keras.optimizers, n))
    if issubclass(cls, adaptive):
        return "sqrt"
    if issubclass(cls, keras.optimizers.SGD):
        return "linear"
    return _unknown(
        f"{cls.__name__} is neither SGD nor an adaptive optimizer ({', '.join(ADAPTIVE)}) "
        "nor a subclass of one"
    )


def _unknown(why: str) -> str:
    warnings.warn(
        f"lr_scaling='auto': {why}; using the linear rule (rate ∝ batch size). Pass "
        "lr_scaling='sqrt' for an adaptive optimizer (its step is normalised by gradient "
        "statistics), or 'linear' / None to choose yourself.",
        LRScalingWarning,
        stacklevel=3,
    )
    return "linear"


def resolve_lr_scaling(rule: str | None, optimizer: Any) -> str | None:
    """`rule`, with "auto" replaced by `rule_for(optimizer)`."""
    check_lr_scaling(rule)
    return rule_for(optimizer) if rule == "auto" else rule


def scaled_learning_rate(
    batch_size: int,
    *,
    base_batch_size: int = 32,
    base_learning_rate: float = 1e-3,
    lr_scaling: str | None = "linear",
) -> float:
    """The learning rate for `batch_size`, scaled from a rate tuned at `base_batch_size`.

    "linear": `base_learning_rate * batch_size / base_batch_size` (Goyal et al., 2017);
    "sqrt": the square root of that ratio (suits adaptive optimizers such as Adam);
    None: `base_learning_rate` unchanged. "auto" needs the optimizer: see
    `resolve_lr_scaling`.

    Example:
        >>> scaled_learning_rate(256, base_batch_size=32, base_learning_rate=0.1)
        0.8

    Raises:
        ValueError: a batch size < 1, a base rate <= 0, or an unknown `lr_scaling`.
    """
    check_lr_scaling(lr_scaling)
    if lr_scaling == "auto":
        raise ValueError(
            "lr_scaling='auto' depends on the optimizer: resolve it first with "
            "resolve_lr_scaling('auto', optimizer)."
        )
    for name, value in (("batch_size", batch_size), ("base_batch_size", base_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    if not isinstance(base_learning_rate, (int, float)) or not base_learning_rate > 0:
        raise ValueError(f"base_learning_rate must be a number > 0, got {base_learning_rate!r}.")
    ratio = batch_size / base_batch_size
    if lr_scaling == "linear":
        return float(base_learning_rate * ratio)
    if lr_scaling == "sqrt":
        return float(base_learning_rate * math.sqrt(ratio))
    return float(base_learning_rate)


@dataclasses.dataclass(frozen=True)
class LRScaling:
    """The learning rate's rule as the batch size changes: the batch and rate it scales
    from, and how.

    Example:
        >>> LRScaling(base_batch_size=32, base_learning_rate=0.1, lr_scaling="linear"
        ...           ).learning_rate(256)
        0.8

    Attributes:
        base_batch_size: the batch the base learning rate was tuned for.
        base_learning_rate: the learning rate at `base_batch_size`; None (default): the
            rate of the optimizer `learning_rate` is given (for `BatchSizeHyperModel`,
            the one `build_model(hp)` compiled with).
        lr_scaling: "auto" (default): "sqrt" for adaptive optimizers (Adam, RMSprop...),
            "linear" for SGD (`rule_for`); or "linear", "sqrt", None (keep the base rate).

    Raises:
        ValueError: an unknown `lr_scaling`, a `base_batch_size` < 1 or a
            `base_learning_rate` <= 0.
    """

    base_batch_size: int = 32
    base_learning_rate: float | None = None
    lr_scaling: str | None = "auto"

    def __post_init__(self) -> None:
        check_lr_scaling(self.lr_scaling)
        base = self.base_learning_rate
        scaled_learning_rate(  # validates the base values
            1,
            base_batch_size=self.base_batch_size,
            base_learning_rate=1.0 if base is None else base,
            lr_scaling=None,
        )
        if base is not None:
            object.__setattr__(self, "base_learning_rate", float(base))

    def learning_rate(self, batch_size: int, optimizer: Any = None) -> float:
        """The learning rate for `batch_size`.

        `optimizer` (an optimizer, its class or its name) gives the base rate when
        `base_learning_rate` is None, and the rule when `lr_scaling` is "auto".

        Raises:
            ValueError: a `batch_size` < 1, or no base rate: none given and `optimizer`
                has none it can scale (a schedule, or no optimizer).
        """
        base = self.base_learning_rate
        if base is None:
            base = rate_of(optimizer)
        return scaled_learning_rate(
            batch_size,
            base_batch_size=self.base_batch_size,
            base_learning_rate=base,
            lr_scaling=resolve_lr_scaling(self.lr_scaling, optimizer),
        )


def rate_of(optimizer: Any) -> float:
    """The learning rate an optimizer (instance, class or name) starts with.

    Raises:
        ValueError: it has none that can be scaled (a schedule), or no optimizer.
    """
    import keras

    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    elif isinstance(optimizer, type):
        optimizer = optimizer()
    rate = getattr(getattr(optimizer, "inner_optimizer", optimizer), "learning_rate", None)
    if rate is None or callable(rate):
        raise ValueError(
            "The base learning rate is read from the optimizer, which has none it can "
            f"scale ({rate!r}). Pass base_learning_rate=... (an LRScaling field)."
        )
    return float(keras.ops.convert_to_numpy(rate))
