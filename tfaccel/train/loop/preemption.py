"""SIGTERM / SIGINT during `fit`: the loop stops after the current step loop, saves, stops.

A signal only sets a flag (`faults.PreemptionWatcher`); after each step loop the workers
decide together (the vote taken with the loop's logs, `LoopResult.stop_vote`; one worker
alone asks its own flag, so a signal sent by a callback counts at once). A stop decided on
an epoch's last loop waits until the epoch is finished, so the run resumes in the next
epoch, not in an empty one. Then `faults.stop` says what happened and exits, or returns
with `preempted` set (`fit(exit_on_preemption=False)`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfaccel.train.loop import faults
from tfaccel.train.loop.faults import PreemptionWatcher
from tfaccel.train.step.runner_interface import LoopResult

if TYPE_CHECKING:
    import tensorflow as tf


class Preemption:
    """The preemption contract of one `fit`; a context manager catching the signals.

    Args:
        strategy: the runner's `tf.distribute.Strategy` (workers vote through it).
        exit_process: `fit(exit_on_preemption=...)`.

    Attributes:
        at_epoch_end: a stop was decided on the epoch's last loop; it happens once the
            epoch is finished.
        preempted: the run stops for a signal (set by the loop before its callbacks'
            `on_train_end`).
    """

    def __init__(self, strategy: tf.distribute.Strategy, exit_process: bool) -> None:
        self.strategy = strategy
        self.exit_process = exit_process
        self.watcher: PreemptionWatcher | None = None
        self.at_epoch_end = False
        self.preempted = False

    def __enter__(self) -> Preemption:
        self.watcher = PreemptionWatcher(self.strategy).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.watcher is not None:
            self.watcher.__exit__(*exc)

    @property
    def signalled(self) -> bool:
        """Whether this process received a signal (the flag a loop's vote carries)."""
        return self.watcher is not None and self.watcher.signal_received is not None

    def should_stop(self, result: LoopResult) -> bool:
        """After a loop: whether every worker stops now. Workers of a cluster use the vote
        taken with the logs (a later signal counts next loop); one worker asks its flag."""
        assert self.watcher is not None, "used inside `with Preemption(...)`"
        stop = result.stop_vote
        if stop is None or not self.watcher.multi_worker:
            stop = self.watcher.should_stop()
        return bool(stop)

    def stop(self, step: int, saved: str | None) -> None:
        """The run stops at global `step` (`saved`: the checkpoint holding it, or None):
        says so, then exits or returns (`faults.stop`)."""
        signum = None if self.watcher is None else self.watcher.signal_received
        faults.stop(signum, step, saved, self.exit_process)
