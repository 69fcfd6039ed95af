"""The one door between the outer loop and the inner loop.

`FitLoop` (epochs, callbacks, validation, checkpoints, preemption), `tfaccel.tuning`
and diagnostics drive training only through this interface; `tfaccel.train.step.runner.Runner`
implements it with `tf.function` step loops, and tests implement it with a few lines of
Python (no TensorFlow step at all).

    runner.build(sample)                         # variables and step loops, once
    result = runner.train(iterator, n)           # up to n optimizer steps -> LoopResult
    logs = runner.evaluate(iterator, n)          # test steps (None: until the data ends)
    runner.epoch_logs(); runner.reset_metrics()  # the running metrics of the epoch
    runner.position; runner.set_position(epoch=, epoch_step=)
    runner.checkpoint_items(); runner.run_shape()
    with runner.restoring(): ...                 # a restore keeps this run's optimizer settings
    runner.restart_optimizer()                   # a fresh optimizer continues at the global step
    runner.state_variables()                     # every variable a step changes (the doctor)
    runner.optimizer; runner.loss; runner.jit_compile  # what the step runs (the doctor)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:
    import tensorflow as tf

# What `train` and `evaluate` read batches from: a distributed dataset's iterator, or a
# dataset's (under the default strategy, which does not wrap the dataset).
Batches: TypeAlias = "tf.distribute.DistributedIterator | tf.data.Iterator"


class Position(NamedTuple):
    """Where training is: applied steps in all, the epoch, and applied steps within it."""

    step: int
    epoch: int
    epoch_step: int


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """What one call of `train` did.

    Attributes:
        steps: optimizer steps applied (fewer than asked when the data ended; 0: none).
        logs: the epoch's running logs after the call (loss, metrics, loss scale...).
        loop_loss: the mean loss of this call's steps alone (divergence check).
        examples: examples trained on in this call.
        seconds: wall time of the call's steps.
        stop_vote: whether any worker asked to stop (None: not voted; ask locally).
        nonfinite: the first trainable variable holding NaN/inf after the call, or None.
        note: a one-time message of the inner loop (e.g. an out-of-memory split), or None.
        input_wait_s: of `seconds`, the time the steps waited for their batches (timed in
            the step loop's graph), or None when not measured.
    """

    steps: int
    logs: dict
    loop_loss: float = float("nan")
    examples: float = 0.0
    seconds: float = 0.0
    stop_vote: bool | None = None
    nonfinite: str | None = None
    note: str | None = None
    input_wait_s: float | None = None


class RunnerInterface(Protocol):
    """What `FitLoop`, the doctor and the tuner may know of the inner loop.

    `tests/test_architecture.py` checks that `tfaccel.doctor` and `tfaccel.tuning` use
    nothing else of a runner.
    """

    strategy: Any  # the tf.distribute.Strategy the data is distributed with
    model: Any  # the Keras model (callbacks see it; `stop_training` is read from it)
    batches_per_step: int  # dataset batches one optimizer step reads (accumulate_steps)
    optimizer: Any  # the Keras optimizer the steps apply (the doctor reads its variables)
    loss: Any  # the per-example loss the steps compute (`losses.PerExampleLoss`)
    jit_compile: bool  # whether the step loops are compiled with XLA

    def build(self, sample: tf.data.Dataset) -> None: ...

    def train(
        self, iterator: Batches, num_steps: int, *, stop_flag: bool = False
    ) -> LoopResult: ...

    def evaluate(self, iterator: Batches, num_steps: int | None) -> dict: ...

    def epoch_logs(self) -> dict: ...

    def reset_metrics(self) -> None: ...

    @property
    def position(self) -> Position: ...

    def set_position(self, *, epoch: int | None = None, epoch_step: int | None = None) -> None: ...

    def checkpoint_items(self) -> dict: ...

    def run_shape(self) -> dict: ...

    def restoring(self) -> contextlib.AbstractContextManager: ...

    def restart_optimizer(self) -> None: ...

    def state_variables(self) -> list: ...
