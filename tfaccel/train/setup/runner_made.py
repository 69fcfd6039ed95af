"""How the Trainer's runner is made, and made anew before step 1 when one of its parts
changes (a method's optimizer, a copy of the model under another dtype policy, an XLA
choice).

The kind of runner follows the model: the Trainer's own steps (`step.runner.Runner`), or
the model's `train_step` / `test_step` (`step.user_step.ModelStepRunner`,
`setup.model_steps`). The optimizer is wrapped for loss scaling when the policy computes
in float16; one the user wrapped stays as given.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfaccel import precision
from tfaccel.train.step import user_step
from tfaccel.train.step.losses import PerExampleLoss
from tfaccel.train.step.runner import EVALUATION_STEPS_PER_LOOP, Runner


@dataclasses.dataclass(frozen=True)
class RunnerMaker:
    """What all of one Trainer's runners share.

    Attributes:
        strategy: the `tf.distribute.Strategy`.
        accumulate_steps: batches per optimizer step.
        on_oom: "raise" or "accumulate".
        steps_per_loop: the Trainer's (an integer, or "auto"); a number also sizes the
            evaluation loops.
        own_steps: the model runs its own `train_step` / `test_step`.
    """

    strategy: tf.distribute.Strategy
    accumulate_steps: int = 1
    on_oom: str = "raise"
    steps_per_loop: int | str = "auto"
    own_steps: bool = False

    def make(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        loss: PerExampleLoss | None,
        metrics: list[keras.metrics.Metric],
        jit_compile: bool,
        policy: str | None = None,
    ) -> tuple[keras.optimizers.Optimizer, Runner]:
        """Returns (the optimizer as the steps apply it, the runner).

        Args:
            model, loss, metrics, jit_compile: what the runner trains and how.
            optimizer: the optimizer as given (unwrapped).
            policy: the dtype policy the model computes under (None: the global one).
        """
        optimizer = precision.wrap_optimizer(optimizer, policy)
        kind = user_step.ModelStepRunner if self.own_steps else Runner
        evaluation = self.steps_per_loop
        if isinstance(evaluation, str):  # "auto"
            evaluation = EVALUATION_STEPS_PER_LOOP
        runner = kind(
            model,
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            strategy=self.strategy,
            jit_compile=jit_compile,
            accumulate_steps=self.accumulate_steps,
            on_oom=self.on_oom,
            evaluation_steps_per_loop=evaluation,
        )
        return optimizer, runner
