"""HostGap: the share of training time spent between batch calls."""

from __future__ import annotations

import time
import warnings

import keras

from tfaccel.callbacks._steps import share, wait_for


class HostGap(keras.callbacks.Callback):
    """Fraction of each epoch's training time spent between batch calls.

    The gap is the time from one `on_train_batch_end` to the next
    `on_train_batch_begin`: Python, callbacks, and input fetched on the host. The
    epoch value (`host_gap_fraction` in the logs) is the summed gaps over the time
    from the first batch begin to the last batch end; above `threshold` it warns
    once per training run. Note: `model.fit` on TensorFlow pulls `tf.data` batches
    *inside* its train function, so there a slow pipeline shows as slow steps,
    not as a gap; the gap catches host-side loops and slow callbacks.

    Args:
        threshold: warn when an epoch's fraction exceeds this (0 < threshold < 1).

    Raises:
        ValueError: a threshold outside (0, 1).
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def __init__(self, threshold: float = 0.2) -> None:
        super().__init__()
        self.threshold = share("threshold", threshold)
        self.fractions: list[float] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.fractions = []
        self._warned = False
        self.on_epoch_begin(None)

    def on_epoch_begin(self, epoch: int | None, logs: dict | None = None) -> None:
        self._first: float | None = None
        self._last_end: float | None = None
        self._gap = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        if self._last_end is not None:
            self._gap += now - self._last_end

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        wait_for(logs)
        self._last_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._first is None or self._last_end is None:
            return
        total = self._last_end - self._first
        fraction = self._gap / total if total > 0 else 0.0
        self.fractions.append(fraction)
        if logs is not None:
            logs["host_gap_fraction"] = fraction
        if fraction > self.threshold and not self._warned:
            self._warned = True
            warnings.warn(
                f"HostGap: {fraction:.0%} of epoch {epoch}'s training time was spent between "
                f"steps (threshold {self.threshold:.0%}): the job waits on the host (input "
                "fetched in Python, slow callbacks). Move input into tf.data with prefetch, "
                "or run more steps per call (steps_per_execution).",
                stacklevel=2,
            )
