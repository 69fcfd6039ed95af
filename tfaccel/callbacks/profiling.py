"""ProfileSteps: one TensorBoard profiler trace over a window of steps."""

from __future__ import annotations

import glob
import os
import warnings

import keras
import tensorflow as tf

from tfaccel.callbacks._steps import StepClock, wait_for


class ProfileSteps(keras.callbacks.Callback):
    """Records one TensorBoard profiler trace over a window of training steps.

    Steps count from 0 over the whole training run. The profiler starts at the
    first batch call that begins at or after `start_step` and stops at the first
    call that ends at or after `stop_step`; with `steps_per_execution > 1` the
    window snaps to execution boundaries. The trace lands in
    `logdir/plugins/profile/<run>/` (open with TensorBoard's Profile tab); its
    path is kept in `trace_dir`.

    Args:
        logdir: directory for the trace (the TensorBoard log directory).
        start_step: first step to record (>= 0).
        stop_step: step at which recording stops (> start_step).

    Raises:
        ValueError: empty `logdir`, negative `start_step`, `stop_step <= start_step`.
        NotADirectoryError: `logdir` (or a folder above it) is an existing file.
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def __init__(self, logdir: str | os.PathLike, start_step: int, stop_step: int) -> None:
        super().__init__()
        if not logdir or not isinstance(logdir, (str, os.PathLike)):
            raise ValueError(f"logdir must be a non-empty path, got {logdir!r}.")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an integer >= 0, got {start_step!r}.")
        if isinstance(stop_step, bool) or not isinstance(stop_step, int):
            raise ValueError(f"stop_step must be an integer, got {stop_step!r}.")
        if stop_step <= start_step:
            raise ValueError(
                f"stop_step ({stop_step}) must be greater than start_step ({start_step}): "
                "the window [start_step, stop_step) would be empty."
            )
        self.logdir = os.fspath(logdir)
        _check_writable_dir(self.logdir)
        self.start_step = start_step
        self.stop_step = stop_step
        self.trace_dir: str | None = None
        self._clock = StepClock()
        self._state = "waiting"  # -> "recording" -> "done"

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._clock.start_epoch()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._state == "waiting" and self._clock.steps >= self.start_step:
            try:
                tf.profiler.experimental.start(self.logdir)
            except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as error:
                self._state = "done"
                warnings.warn(
                    f"ProfileSteps could not start the profiler ({error}); another profiler "
                    "is running (e.g. TensorBoard(profile_batch=...)). No trace recorded.",
                    stacklevel=2,
                )
                return
            self._state = "recording"

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._clock.advance(batch, logs, self.params)
        if self._state == "recording" and self._clock.steps >= self.stop_step:
            wait_for(logs)
            self._stop()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._state == "recording":
            self._stop()

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._state = "done"
        runs = glob.glob(os.path.join(self.logdir, "plugins", "profile", "*"))
        self.trace_dir = max(runs, key=os.path.getmtime) if runs else None


def _check_writable_dir(logdir: str) -> None:
    """Raises NotADirectoryError when `logdir` or one of its parents is a file."""
    path = os.path.abspath(logdir)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
    if not os.path.isdir(path):
        which = "is" if path == os.path.abspath(logdir) else f"is below {path!r}, which is"
        raise NotADirectoryError(
            f"ProfileSteps logdir {logdir!r} {which} a file, not a folder, so no trace "
            "could be written there. Pass a folder path, e.g. the TensorBoard log directory "
            "'runs/exp1'."
        )
