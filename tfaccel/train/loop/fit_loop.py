"""The outer loop of `Trainer.fit`: epochs of step loops, and the callbacks around them.

`FitLoop` keeps the epoch loop; each of its concerns is a part of its own, in this folder:
the training input and its iterators (`stream.Stream`), the validation after each epoch
(`validation.Validation`), saving and resuming (`checkpoints.Checkpoints`), SIGTERM /
SIGINT (`preemption.Preemption`), a non-finite loss or weight (`divergence.Divergence`),
and what the loop says — an out-of-memory split, the measured steps per loop, a resume's
changes (`notes.Notes`). The global batches of a `tfaccel.data` pipeline do not depend on
the replicas (nor, reading rows in memory, on the workers:
`tfaccel.data.order.global_order`), so a run saved on N resumes on M.

The inner loop is a runner (`runner_interface.RunnerInterface`; the Trainer's is
`runner.Runner`): this module and its parts ask it for n steps, its logs, its position and
its checkpoint items, and read nothing else of it — no variable, metric or step function.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import keras

from tfaccel.choices import agreement
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.data import Feed
from tfaccel.train.loop import stream as streams
from tfaccel.train.loop.checkpoints import Checkpoints
from tfaccel.train.loop.divergence import Divergence
from tfaccel.train.loop.notes import Notes
from tfaccel.train.loop.preemption import Preemption
from tfaccel.train.loop.progress import ProgressBar
from tfaccel.train.loop.stream import Stream
from tfaccel.train.loop.validation import Validation
from tfaccel.train.setup import arguments
from tfaccel.train.state.batch_stages import BatchStages
from tfaccel.train.state.policies import Checkpointing, FaultPolicy
from tfaccel.train.step.runner_interface import Batches, LoopResult, RunnerInterface


@dataclasses.dataclass
class Schedule:
    """What runs when in one `fit`: the epochs, the steps of each, the validation after
    each, the loop sizing and the progress display (`verbose="auto"` is 1).

    Raises:
        ValueError: `epochs` or `initial_epoch` < 0, `steps_per_epoch` or
            `validation_steps` < 1 (or not integers).
    """

    epochs: int
    steps_per_epoch: int | None = None
    initial_epoch: int = 0  # where a run without a checkpoint starts
    validation: Feed | None = None
    validation_steps: int | None = None
    sizer: LoopSizer | None = None
    verbose: int | str = 1
    stages: BatchStages | None = None  # the progressive batch's (`methods_setup` sets them)

    def __post_init__(self) -> None:
        arguments.check_initial_epoch(self.initial_epoch)  # in the order fit checked them
        arguments.check_steps("validation_steps", self.validation_steps)
        for name, least in (("epochs", 0), ("steps_per_epoch", 1)):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < least
            ):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
        self.verbose = 1 if self.verbose == "auto" else self.verbose
        self.sizer = self.sizer or LoopSizer("auto")


class FitLoop:
    """One `fit` call of a Trainer (see `Trainer.fit` for the arguments).

    Args:
        runner: the inner loop (`runner_interface.RunnerInterface`).
        train: the training `Feed`.
        schedule: epochs, steps, validation, loop sizing, verbosity.
        callbacks: the user's Keras callbacks.
        checkpointing: where and when to save, and how to resume (`policies.Checkpointing`).
        faults: divergence and preemption (`policies.FaultPolicy`).
    """

    def __init__(
        self,
        runner: RunnerInterface,
        train: Feed,
        schedule: Schedule,
        callbacks: Sequence[keras.callbacks.Callback] = (),
        checkpointing: Checkpointing | None = None,
        faults: FaultPolicy | None = None,
    ) -> None:
        checkpointing = checkpointing or Checkpointing(None)
        faults = faults or FaultPolicy()
        self.runner = runner
        self.sizer: LoopSizer = schedule.sizer or LoopSizer("auto")
        self.epochs = schedule.epochs
        self.initial_epoch = schedule.initial_epoch
        self.stages = schedule.stages
        self.input = Stream(train, schedule.steps_per_epoch, runner.batches_per_step, self.stages)
        self.steps_per_epoch = steps_per_epoch = self.input.steps_per_epoch
        train = self.input.feed
        self.validation = Validation(schedule.validation, schedule.validation_steps)
        self.callbacks = keras.callbacks.CallbackList(
            list(callbacks) + ([ProgressBar()] if schedule.verbose else []),
            add_history=True,
            add_progbar=False,
            model=runner.model,
            verbose=schedule.verbose,
            epochs=self.epochs,
            steps=steps_per_epoch,
            batch_size=train.global_batch,
        )
        self.sizer.honour_callbacks(callbacks)  # "auto": one step a loop for per-batch hooks
        self.said = Notes(schedule.verbose)
        run_shape = {
            "global_batch": train.global_batch,
            "steps_per_epoch": steps_per_epoch,
            **runner.run_shape(),  # optimizer type and hyperparameters, accumulate_steps
            "dataset": train.describe_spec(),
            "input_pipelines": train.pipelines,  # a changed count resumes only a global order
            "input_order": train.order,
        }
        self.checkpoints = Checkpoints(
            runner, train, checkpointing, run_shape, self.said, self.stages
        )
        restore = self.checkpoints.restore_last_good if faults.restore_on_divergence else None
        self.divergence = Divergence(faults.divergence_loops, restore)
        self.preemption = Preemption(runner.strategy, faults.exit_on_preemption)

    @property
    def notes(self) -> dict:
        """Additions to the settings table (what changed on resume, measured, split)."""
        return self.said.table

    @property
    def preempted(self) -> bool:
        """Whether the run stopped for SIGTERM / SIGINT."""
        return self.preemption.preempted

    def close(self) -> None:
        """Releases the checkpoint directory; `fit` calls it however it ends."""
        self.checkpoints.close()

    def _iterator(self, resumed_steps: int = 0) -> Batches:
        """A new iterator over the training input, positioned after `resumed_steps` steps
        (with batch stages: batches of the start size); a stream's joins the checkpoint
        when it can (else a resumed run skips what was done)."""
        checkpoints, first = self.checkpoints, resumed_steps
        if self.stages is not None and not resumed_steps:  # e.g. initial_epoch
            first = self.stages.batches_before(*self.runner.position[1:])
        iterator = self.input.iterator(
            resumed_steps, positions=checkpoints.enabled, notes=self.said, first=first
        )
        if self.input.stream and self.stages is None:
            checkpoints.track_iterator(iterator)
        return iterator

    # -- the run -------------------------------------------------------------------------

    def run(self) -> keras.callbacks.History:
        # A saveable iterator must exist before the restore, which reads its position. Any
        # other is made after it, once: a second iterator of one dataset would start from the
        # shuffle's next seeds (its seed generator is shared), not the run's first.
        checkpoints, stream = self.checkpoints, self.input.stream
        saveable = (  # the checkpoint asked first: asking the input distributes it
            checkpoints.enabled and self.input.saveable() and checkpoints.will_restore_iterator()
        )
        iterator = self._iterator() if saveable else None
        done_in_run = checkpoints.restore(
            epochs=self.epochs,
            initial_epoch=self.initial_epoch,
            steps_per_epoch=self.steps_per_epoch,
        )
        if stream and (iterator is None or (done_in_run and checkpoints.iterator_not_restored())):
            iterator = self._iterator(done_in_run)
        _, start_epoch, in_epoch = self.runner.position
        # Without a stream (unknown length) an interrupted epoch restarts from its start.
        skip_in_epoch = in_epoch if stream else 0
        self.runner.model.stop_training = False
        self.callbacks.on_train_begin()
        epoch_logs: dict = {}
        with self.preemption:
            for epoch in range(start_epoch, self.epochs):
                first = skip_in_epoch if epoch == start_epoch else 0
                if not first:
                    self.runner.reset_metrics()
                self._stage(epoch)
                self.callbacks.on_epoch_begin(epoch)
                if not stream:
                    iterator = self._iterator()
                status = self._train_epoch(iterator, first)
                if status == "empty":  # nothing to log: no History entry of loss 0
                    streams.no_batch(epoch, trained=epoch > start_epoch)
                    break
                if status == "preempted":
                    return self._stop_for_preemption(epoch_logs)
                epoch_logs = self.runner.epoch_logs()
                epoch_logs.update(self.validation.logs(self.runner, self.callbacks))
                if self.stages is not None:  # before every callback: History, TensorBoard
                    epoch_logs["batch_size"] = self.stages.factor(epoch) * self.stages.batch
                if status == "done":
                    self.runner.set_position(epoch=epoch + 1, epoch_step=0)
                # Saved after the callbacks: what their `on_epoch_end` changed (a rate
                # ReduceLROnPlateau lowered, a plateau decay) is the resumed run's too.
                self.callbacks.on_epoch_end(epoch, epoch_logs)
                checkpoints.epoch_ended(finished=status == "done")
                if self.preemption.at_epoch_end:
                    return self._stop_for_preemption(epoch_logs)
                if status == "exhausted":
                    step = self.runner.position.step
                    streams.warn_exhausted(step, self.epochs, self.steps_per_epoch)
                    break
                if self.runner.model.stop_training:
                    break
            checkpoints.save()
            checkpoints.wait()
        self.callbacks.on_train_end(epoch_logs)
        return self.runner.model.history

    def _stage(self, epoch: int) -> None:
        """With batch stages: `epoch`'s steps (its stage's), for the loop and the progress."""
        if self.stages is not None:
            self.steps_per_epoch = self.stages.steps_in(epoch)
            params = self.callbacks.params or {}
            self.callbacks.set_params({**params, "steps": self.steps_per_epoch})

    def _loop_size(self, done: int) -> int:
        want = self.sizer.next()
        if self.steps_per_epoch is not None:
            want = min(want, self.steps_per_epoch - done)
        return self.checkpoints.clip(want)

    def _train_epoch(self, iterator, done: int) -> str:
        """Runs one epoch of loops; returns "done", "stopped", "exhausted", "empty" or
        "preempted"."""
        runner = self.runner
        while self.steps_per_epoch is None or done < self.steps_per_epoch:
            want = self._loop_size(done)
            began = time.perf_counter()  # a call's whole host cost: callbacks and logs too
            self.callbacks.on_train_batch_begin(done)
            # Logs, loop loss, example count and the stop vote: one collective per loop.
            result = runner.train(iterator, want, stop_flag=self.preemption.signalled)
            ran = result.steps
            if result.note:
                self.said.out_of_memory(result.note)
            if ran == 0:
                if self.steps_per_epoch is not None:
                    return "exhausted"
                return "empty" if done == 0 else "done"
            done += ran
            runner.set_position(epoch_step=done)
            step = runner.position.step
            self.divergence.check(result, step)
            self.callbacks.on_train_batch_end(done - 1, _batch_logs(result))
            self._size_loops(want, ran, time.perf_counter() - began)
            epoch_end = self.steps_per_epoch is not None and done >= self.steps_per_epoch
            if self.divergence.healthy:
                self.checkpoints.after_loop(step, epoch_end)
            if self.preemption.should_stop(result):
                if not epoch_end:
                    return "preempted"
                self.preemption.at_epoch_end = True
            if ran < want:
                return "exhausted" if self.steps_per_epoch is not None else "done"
            if epoch_end or self.preemption.at_epoch_end:
                return "done"
            if runner.model.stop_training:
                return "stopped"
        return "done"

    def _size_loops(self, want: int, ran: int, seconds: float) -> None:
        """Records a loop's host time for `steps_per_loop="auto"`; says n once chosen."""
        if self.sizer.measuring:  # every worker must choose the same n
            seconds = agreement.agree(self.runner.strategy, seconds)
        if self.sizer.record(want, ran, seconds):
            self.said.loop_size(self.sizer.describe(self.steps_per_epoch))

    def _stop_for_preemption(self, epoch_logs: dict) -> keras.callbacks.History:
        self.checkpoints.save()
        self.checkpoints.wait()  # only a complete checkpoint lets the process exit 0
        self.preemption.preempted = True
        self.callbacks.on_train_end(epoch_logs)
        step = self.runner.position.step
        self.preemption.stop(step, self.checkpoints.saved_at(step))
        return self.runner.model.history


def _batch_logs(result: LoopResult) -> dict:
    """A loop's logs for the callbacks' `on_train_batch_end`: the epoch's running logs, the
    steps it ran, its examples per second, its input wait (for `callbacks.Bottleneck`)."""
    logs = dict(result.logs)
    logs["steps"] = result.steps
    logs["examples_per_second"] = result.examples / result.seconds if result.seconds > 0 else 0.0
    if result.input_wait_s is not None:
        logs["input_wait_s"] = result.input_wait_s
    return logs
