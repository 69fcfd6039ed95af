"""Stochastic depth on `tfaccel.blocks` residual blocks.

In training, each residual block drops its residual branch for some examples (the
shortcut alone passes), with a probability growing linearly with depth up to `rate` at
the last block (Huang et al.'s linear rule); inference is unchanged. It is the blocks'
own `drop_rate` option, so a saved `.keras` file keeps it and loads after `import
tfaccel`; the drop masks' random state is a variable of each block, saved in checkpoints.
"""

from __future__ import annotations

import keras

from tfaccel.blocks import BottleneckBlock, ResidualBlock
from tfaccel.methods.base import Card, Job, Method, MethodPlan


def residual_blocks(model: keras.Model) -> list:
    """The model's residual and bottleneck blocks, in order (nested models included)."""
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += residual_blocks(layer)
        elif isinstance(layer, (ResidualBlock, BottleneckBlock)):
            found.append(layer)
    return found


class StochasticDepth(Method):
    """Drops residual branches per example in training, up to `rate` at the last block.

    Args:
        rate: the drop probability of the last block, in (0, 1); block i of n drops
            with `rate * (i + 1) / n`.

    Raises:
        ValueError: a rate outside (0, 1); at `check`, a model without
            `tfaccel.blocks` residual blocks, or blocks with `remat=True`.
    """

    name = "stochastic depth"
    kinds = ("image",)
    stateful = "the drop masks' seeds are block variables: checkpointed with the model"
    card = Card(
        changes=(
            "the forward pass in training of `tfaccel.blocks` residual blocks: branches "
            "dropped per example, up to `rate` at the last block (a block's `drop_rate`, "
            "saved in `.keras` files); inference unchanged"
        ),
        helps="deep networks trained long, as a regularizer (not measured here)",
        hurts=(
            "short jobs: on 6 epochs it costs more than it gives; models without "
            '`tfaccel.blocks` residual blocks (refused); not in `"fast"`'
        ),
        measured=(
            "On the digits ResNet: epochs 1.00×, time 0.99× [0.68, 1.12], final 0.956 vs 0.952."
        ),
        defaults="rate=0.1, the setting measured (not set by a measurement)",
        measured_as="StochasticDepth(0.1)",
        contender="stochastic_depth",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, rate: float = 0.1):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise ValueError(f"StochasticDepth rate must be in (0, 1), got {rate!r}.")
        self.rate = float(rate)

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return (
            f"the forward pass in training: residual branches dropped per example, up to "
            f"{self.rate:g} at the last block (inference unchanged)"
        )

    def rates(self, count: int) -> list[float]:
        """The linear rule: block i of `count` drops with `rate * (i + 1) / count`."""
        return [self.rate * (i + 1) / count for i in range(count)]

    def check(self, job: Job) -> None:
        blocks = residual_blocks(job.model)
        if not blocks:
            raise ValueError(
                "StochasticDepth drops the residual branches of tfaccel.blocks.ResidualBlock"
                " / BottleneckBlock layers; this model has none."
            )
        remat = [b.name for b in blocks if b.remat]
        if remat:
            raise ValueError(
                f"StochasticDepth cannot drop branches of blocks with remat=True ({remat}): "
                "the recomputation would draw another mask."
            )

    def apply(self, plan: MethodPlan) -> None:
        blocks = residual_blocks(plan.job.model)
        for block, rate in zip(blocks, self.rates(len(blocks)), strict=True):
            block.set_drop_rate(rate)
