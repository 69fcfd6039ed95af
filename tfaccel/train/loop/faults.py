"""Fault handling: preemption signals and divergence.

Preemption: SIGTERM / SIGINT during `fit` end the current step loop, then save and stop.
An interrupted run never looks finished: `stop` says on stderr what happened and exits 0
only when a checkpoint holds the run (the preemption contract: run the same command to
resume); without one, SIGINT raises `KeyboardInterrupt` and SIGTERM exits 128 + 15.

A signal only sets a flag; the Trainer checks it between step loops. In multi-worker
jobs the workers agree on the decision with one tiny all-reduce per loop, so every
worker stops after the same step (a worker that stopped alone would leave the others
waiting in a collective). This is the part of
`tf.distribute.experimental.PreemptionCheckpointHandler` that applies on any cluster;
that handler itself needs TensorFlow's coordination service and a platform-specific
termination watcher, so tfaccel does not depend on it.
"""

from __future__ import annotations

import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.errors import TrainingDivergedError  # noqa: F401 (re-exported)

# What `signal.signal` takes and gives back: a function, SIG_DFL / SIG_IGN, or None.
_Handler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptionWatcher:
    """Catches SIGTERM/SIGINT while active and answers `should_stop()` for all workers."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy
        self.signal_received: int | None = None
        self._previous: dict[int, _Handler] = {}  # the handlers replaced, by signal
        self._multi_worker = getattr(strategy.extended, "_num_workers", 1) > 1
        if self._multi_worker:
            self._agree = tf.function(self._all_reduce_sum)

    @property
    def multi_worker(self) -> bool:
        """True when stopping needs the workers' agreement (a collective)."""
        return self._multi_worker

    def _handler(self, signum: int, frame: types.FrameType | None) -> None:
        if signum == signal.SIGINT and self.signal_received == signal.SIGINT:
            raise KeyboardInterrupt("a second Ctrl-C: stopped at once, nothing saved")
        if self.signal_received is None:
            print(
                f"tfaccel: {signal.Signals(signum).name} received: finishing the current step "
                "loop, then stopping"
                + (
                    " (Ctrl-C again stops at once, saving nothing)."
                    if signum == signal.SIGINT
                    else "."
                ),
                file=sys.stderr,
                flush=True,
            )
        self.signal_received = signum

    def __enter__(self) -> PreemptionWatcher:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _all_reduce_sum(self, flag: tf.Tensor) -> tf.Tensor:
        value = self.strategy.run(lambda: tf.identity(flag))
        return self.strategy.reduce("SUM", value, axis=None)

    def should_stop(self) -> bool:
        """True when any worker received a signal (a collective in multi-worker jobs)."""
        local = 1 if self.signal_received is not None else 0
        if not self._multi_worker:
            return bool(local)
        return bool(self._agree(tf.constant(local, tf.int32)).numpy() > 0)


def stop(signum: int | None, step: int, saved: str | None, exit_process: bool) -> None:
    """After a preempted run's last loop: says what happened, then exits or returns.

    Args:
        signum: the signal this process received (None: another worker's vote).
        step: the global step reached.
        saved: the checkpoint holding `step`, or None when nothing was saved.
        exit_process: `fit(exit_on_preemption=...)`.

    Raises:
        SystemExit: 0 when `saved` (the documented preemption contract), else 128 + signal.
        KeyboardInterrupt: SIGINT (Ctrl-C) without a checkpoint.
    """
    what = signal.Signals(signum).name if signum else "a stop voted by another worker"
    message = f"tfaccel: training interrupted by {what} after step {step}; "
    if saved:
        message += f"saved the checkpoint {saved}: run the same command to resume."
    else:
        message += (
            "nothing was saved (fit has no checkpoint_dir) and the run did not finish. The "
            "weights trained so far are in the model."
        )
    if exit_process and saved:
        message += " Exiting with status 0 (fit(exit_on_preemption=True))."
    elif exit_process:
        code = 128 + (signum or signal.SIGTERM)
        if signum != signal.SIGINT:
            message += f" Exiting with status {code}."
    print(message, file=sys.stderr, flush=True)
    if not exit_process:
        return
    if saved:
        raise SystemExit(0)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt(message)
    raise SystemExit(128 + (signum or signal.SIGTERM))
