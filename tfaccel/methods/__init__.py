"""Speed-up methods for time to accuracy: composed, checked, on by one argument.

Each method is a small object that states what it changes (`changes`), checks the job
before step 1 (`check`) and adds its part to a plan (`apply`): a batch map, a loss, an
optimizer change or a callback. Use them with plain Keras through `for_fit`, or with
`tfaccel.Trainer(..., methods=[...])` / `methods="fast"`. `for_fit` takes what `model.fit`
takes (a dataset, or arrays with `batch_size`, `sample_weight`, `validation_split`); the
job's kind for "fast" is read from the model (`kind_of`).

| method | changes |
| --- | --- |
| `LabelSmoothing(eps)` | the loss: smoothed targets (Keras' `label_smoothing`) |
| `MixUp(alpha)`, `CutMix(alpha)` | the inputs and labels: batches mixed pairwise |
| `EMA(decay)` | the weights used for evaluation and saving (Keras' `use_ema`) |
| `OneCycle()`, `WarmupCosine()` | the learning rate, sized to the job's steps and batch |
| `Plateau(scale)` | the learning rate: a warm-up, then halved when the loss stalls (no end date) |
| `LayerFreezing(start, fraction)` | which weights train: early layers freeze late |
| `StochasticDepth(rate)` | the forward pass in training of `tfaccel.blocks` residual blocks |
| `ProgressiveResizing(start, stages)` | the inputs: smaller images early |
| `ProgressiveBatch(final, stages)` | the batch: grown to the gradient noise scale (`model.fit`) |

Each method class carries its `Card` (`methods.OneCycle.card`; `FAST_CARD` for "fast"): what
it changes, when it helps, where it hurts, what it measured and which benchmark result set its
defaults. The docs' card table is made from them (`python -m tfaccel.methods.cards`).

Example:
    >>> from tfaccel import methods
    >>> plan = methods.for_fit([methods.LabelSmoothing(0.1), methods.OneCycle()], model,
    ...     x, y, epochs=10, validation_split=0.1, loss="sparse_categorical_crossentropy")
    >>> model.compile(plan.optimizer, plan.loss,
    ...               metrics=plan.metrics(["sparse_categorical_accuracy"]))
    >>> model.fit(plan.dataset, epochs=10, callbacks=plan.callbacks,
    ...           validation_data=plan.validation_data)           # doctest: +SKIP
"""

from tfaccel.methods.adaptive.plateau import Plateau
from tfaccel.methods.averaging import EMA, SwapAverages
from tfaccel.methods.base import Card, Job, Method, MethodPlan, Plan
from tfaccel.methods.batch_growth import ProgressiveBatch
from tfaccel.methods.composition import (
    FAST,
    FAST_CARD,
    LONG_EPOCH_STEPS,
    compose,
    plan_for,
    resolve,
)
from tfaccel.methods.depth import StochasticDepth
from tfaccel.methods.fitting import FitPlan, for_fit
from tfaccel.methods.freezing import LayerFreezing
from tfaccel.methods.kinds import kind_of
from tfaccel.methods.label_methods import CutMix, LabelSmoothing, MixUp
from tfaccel.methods.resizing import ProgressiveResizing
from tfaccel.methods.schedules import OneCycle, WarmupCosine

__all__ = [
    "EMA",
    "FAST",
    "FAST_CARD",
    "FitPlan",
    "LONG_EPOCH_STEPS",
    "Card",
    "CutMix",
    "Job",
    "LabelSmoothing",
    "LayerFreezing",
    "Method",
    "MethodPlan",
    "MixUp",
    "OneCycle",
    "Plan",
    "Plateau",
    "ProgressiveBatch",
    "ProgressiveResizing",
    "StochasticDepth",
    "SwapAverages",
    "WarmupCosine",
    "compose",
    "for_fit",
    "kind_of",
    "plan_for",
    "resolve",
]


def __getattr__(name: str) -> object:
    """`LONG_JOB_STEPS` (total steps) was replaced by `LONG_EPOCH_STEPS` (steps an epoch)."""
    if name == "LONG_JOB_STEPS":
        raise AttributeError(
            "tfaccel.methods.LONG_JOB_STEPS was removed: the long-job rule no longer reads the "
            "declared epochs; use tfaccel.methods.LONG_EPOCH_STEPS (optimizer steps an epoch)."
        )
    raise AttributeError(f"module 'tfaccel.methods' has no attribute {name!r}")
