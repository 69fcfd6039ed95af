"""What a Trainer shows of its run between calls, and the model it writes out.

`TrainerState` is a base of `tfaccel.Trainer` (as Keras composes `keras.Model` of a
trainer and a layer): the runner's counters and running metrics under the names Trainer
users know, what a checkpoint holds, and the model saved (`.keras`) or exported
(SavedModel), chief-only (`saving`). It reads only the Trainer's public `runner`, `model`
and `strategy`.
"""

from __future__ import annotations

import os
from typing import Any

from tfaccel.train.state import saving


class TrainerState:
    """The Trainer's state and files (see `tfaccel.Trainer`)."""

    runner: Any  # the inner loop (`runner_interface.RunnerInterface`)
    model: Any  # the Keras model trained
    strategy: Any  # the `tf.distribute.Strategy`
    startup: Any  # the last `fit`'s start-up report (`setup.startup.Startup`), None before

    step = property(lambda self: self.runner.step, doc="The global step (applied steps).")
    epoch = property(lambda self: self.runner.epoch, doc="The epoch counter (a variable).")
    epoch_step = property(lambda self: self.runner.epoch_step, doc="Steps into the epoch.")
    loss_tracker = property(lambda self: self.runner.loss_tracker, doc="The running loss.")
    skipped_steps = property(
        lambda self: self.runner.skipped_steps,
        doc="Steps whose gradients were not finite and were skipped by loss scaling.",
    )

    def checkpoint_objects(self) -> dict:
        """The state a checkpoint holds: step counters, model, optimizer, metrics' running state."""
        return self.runner.checkpoint_items()

    def optimizer_type(self) -> str:
        """The optimizer's class name, looking through loss scaling (saved in checkpoints)."""
        return self.runner.optimizer_type()

    def logs(self) -> dict:
        """The running loss and metrics of the current epoch."""
        return self.runner.epoch_logs()

    def reset_metrics(self) -> None:
        """Resets the loss tracker and the metrics (as `model.reset_metrics`)."""
        self.runner.reset_metrics()

    def save(self, filepath: str | os.PathLike[str]) -> str:
        """Saves the model as a `.keras` file (architecture and weights, not compiled).

        Load it with `keras.saving.load_model(filepath)` after `import tfaccel` (which
        registers tfaccel's layers), or `tfaccel.parallel.load_model` for a
        `PipelineModel`. Under multi-worker, call it on every worker: the chief writes
        `filepath`, the others a temporary copy they delete. Variables each replica
        keeps for itself (BatchNormalization's moving statistics) are saved as the
        chief's first replica holds them (`callbacks.SyncMovingStatistics` makes them
        equal). Returns `filepath`.

        Raises:
            ValueError: a path not ending in `.keras`, a directory, or a model not built.
        """
        return saving.save(self.model, filepath, self.strategy)

    def export(self, dirpath: str | os.PathLike[str], **kwargs: Any) -> str:
        """Exports a SavedModel for serving (`model.export`; `kwargs` are its arguments).

        Load it with `tf.saved_model.load(dirpath).serve(x)` (or TF Serving). Under
        multi-worker, call it on every worker; only the chief writes `dirpath`.
        Returns `dirpath`.

        Raises:
            ValueError: `dirpath` is a file, or the model is not built.
        """
        return saving.export(self.model, dirpath, self.strategy, **kwargs)
