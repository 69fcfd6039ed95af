"""`fit(validation_data=...)`: the validation after each epoch, as `model.fit` runs it.

The callbacks see it as `model.fit`'s (their `on_test_begin` / `on_test_end`, e.g. an
EMA's weight swap), and its logs join the epoch's as `val_<name>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfaccel.data import iterators

if TYPE_CHECKING:
    import keras

    from tfaccel.data import Feed
    from tfaccel.train.step.runner_interface import RunnerInterface


class Validation:
    """The validation of one `fit` (none when `feed` is None).

    Args:
        feed: the validation `Feed` (checked by `Trainer.feed`), or None.
        steps: `validation_steps` (None: until the data ends).
    """

    def __init__(self, feed: Feed | None, steps: int | None = None):
        self.steps = steps
        self.dataset = None if feed is None else feed.distribute()

    def logs(
        self, runner: RunnerInterface, callbacks: keras.callbacks.CallbackList
    ) -> dict[str, Any]:
        """Evaluates with `runner` (a fresh pass over the data); returns the `val_*` logs
        ({} without validation data)."""
        if self.dataset is None:
            return {}
        callbacks.on_test_begin()
        logs = runner.evaluate(iterators.adopt(iter(self.dataset)), self.steps)
        callbacks.on_test_end(logs)
        return {f"val_{k}": v for k, v in logs.items()}
