"""EMA: an exponential moving average of the weights, used for evaluation and saving.

The average is Keras' own (`optimizer(use_ema=True, ema_momentum=decay)`): after each
step `average = decay * average + (1 - decay) * weights` (the first step copies the
weights). It lives in the optimizer's variables, so a checkpoint of the optimizer holds
it and a resumed run goes on with it. `SwapAverages` (a `keras.callbacks.SwapEMAWeights`)
puts the averages in the model while it is evaluated, and when training ends the model
keeps the averages (`optimizer.finalize_variable_values`, as `model.fit` does): what
evaluation, `model.save` and the exported `.keras` see are the averaged weights.
"""

from __future__ import annotations

from typing import Any

import keras

from tfaccel.methods.base import Card, Job, Method, MethodPlan, optimizer_object


class SwapAverages(keras.callbacks.SwapEMAWeights):
    """Evaluates with the averaged weights; at the end of training the model keeps them.

    Keras' `SwapEMAWeights` around evaluation, plus the end of training: `model.fit`
    finalizes the averages itself, the Trainer through this callback (idempotent: both
    copy the averages into the weights).
    """

    def on_train_end(self, logs: dict | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)
        if optimizer is not None and getattr(optimizer, "use_ema", False):
            optimizer.finalize_variable_values(self.model.trainable_variables)


def check_decay(decay: Any) -> float:
    """Returns `decay` as a float in (0, 1), or raises."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)):
        raise TypeError(f"EMA decay must be a number in (0, 1), got {type(decay).__name__}.")
    if not 0.0 < float(decay) < 1.0:
        raise ValueError(
            f"EMA decay must be in (0, 1), got {decay}: 0 keeps no average and 1 never "
            "moves from the first weights. Typical: 0.99 for short jobs, 0.999 for long."
        )
    return float(decay)


class EMA(Method):
    """Averages the weights (Keras' optimizer `use_ema`); evaluation and saving use them.

    Args:
        decay: the average's momentum, in (0, 1). The average spans about
            `1 / (1 - decay)` steps: keep that well under the job's steps.

    Raises:
        ValueError: decay outside (0, 1).
    """

    name = "ema"
    stateful = "the averages are optimizer variables: checkpointed with it"
    card = Card(
        changes=(
            "the weights used for evaluation and saving: Keras' optimizer `use_ema`, the "
            "averages swapped in for validation and kept at the end (what `model.save` and "
            "`trainer.save` write)"
        ),
        helps="a slightly better end point, on jobs well longer than its span",
        hurts=(
            "the time to a target (up to 1.23× on the table); costs one copy of the weights; "
            'does not stack with layer freezing; not in `"fast"`'
        ),
        measured=(
            "Epochs 0.89× (CNN, final 0.885 vs 0.867), 1.06× (GRU), 1.00× (table); time "
            "0.96×, 1.07×, 1.23×."
        ),
        defaults=(
            "decay=0.99, the usual value for short jobs (0.999 for long; not set by a "
            "measurement here); the benchmark ran 0.9"
        ),
        measured_as="EMA(0.9)",
        contender="ema",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, decay: float = 0.99):
        self.decay = check_decay(decay)

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return (
            f"the weights used for evaluation and saving: an average over ~"
            f"{round(1 / (1 - self.decay))} steps (decay {self.decay:g})"
        )

    def check(self, job: Job) -> None:
        optimizer = optimizer_object(job.optimizer)
        if getattr(optimizer, "ema_overwrite_frequency", None):
            raise ValueError(
                "EMA: the optimizer overwrites the weights with their average every "
                f"{optimizer.ema_overwrite_frequency} steps; pass one without "
                "ema_overwrite_frequency (the method swaps the averages in for evaluation)."
            )
        span = 1.0 / (1.0 - self.decay)
        if span > job.total_steps:
            raise ValueError(
                f"EMA decay {self.decay:g} averages over ~{span:.0f} steps, more than the "
                f"job's {job.total_steps}: the average would still hold the first weights. "
                f"Use a decay <= {1 - 1 / max(job.total_steps, 2):.4f}."
            )

    def apply(self, plan: MethodPlan) -> None:
        plan.rebuild_optimizer(use_ema=True, ema_momentum=self.decay)
        plan.callbacks.append(SwapAverages())
