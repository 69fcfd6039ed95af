"""The outer loop of `Trainer.fit`: epochs, callbacks, validation, checkpoints, faults.

Input position. A finite dataset of known length runs as one repeated stream with
`steps_per_epoch` = its length, so a single iterator spans the whole run. Resuming
restores that iterator from the checkpoint when it is a plain `tf.data` iterator
(default / one-device strategy); distributed iterators cannot be saved, so they are
fast-forwarded with `skip` over the steps already done (exact for a deterministic,
seeded pipeline; cheap when the pipeline caches). Datasets of unknown length get a
new iterator each epoch and, on resume, restart the interrupted epoch. The global
batches of a `tfaccel.data` pipeline do not depend on the replicas (nor, reading rows in
memory, on the workers: `tfaccel.data.order.global_order`), so a run saved on N resumes on M.

Epoch boundaries. A save that lands on an epoch's last step waits until the epoch
is finished (validation run, epoch counter advanced), so it belongs to that epoch:
a resumed run never logs an epoch of zero steps.

The inner loop is a runner (`runner_interface.RunnerInterface`; the Trainer's is
`runner.Runner`): this module asks it for n steps, its logs, its position and its
checkpoint items, and reads nothing else of it — no variable, metric or step function.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import warnings

import keras
import tensorflow as tf

from tfaccel.choices import agreement
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.data import iterators
from tfaccel.data.assembly.feed import INFINITE, Feed
from tfaccel.data.order import augment_seeds
from tfaccel.data.service.stage import RESUME_NOTE
from tfaccel.train.loop import faults
from tfaccel.train.loop.faults import PreemptionWatcher, TrainingDivergedError
from tfaccel.train.loop.progress import ProgressBar
from tfaccel.train.state import hyperparameters
from tfaccel.train.state.checkpoint import ITERATOR_KEYS, POSITION_KEYS, CheckpointState
from tfaccel.train.state.policies import Checkpointing, FaultPolicy
from tfaccel.train.step import accumulation

logger = logging.getLogger("tfaccel")


@dataclasses.dataclass
class Schedule:
    """What runs when in one `fit`: the epochs, the steps of each, the validation after
    each, the loop sizing and the progress display.

    Raises:
        ValueError: `epochs` < 0 or `steps_per_epoch` < 1 (or not integers).
    """

    epochs: int
    steps_per_epoch: int | None = None
    initial_epoch: int = 0  # where a run without a checkpoint starts
    validation: Feed | None = None
    validation_steps: int | None = None
    sizer: LoopSizer | None = None
    verbose: int = 1

    def __post_init__(self):
        for name, least in (("epochs", 0), ("steps_per_epoch", 1)):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < least
            ):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
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
        runner,
        train: Feed,
        schedule: Schedule,
        callbacks=(),
        checkpointing: Checkpointing | None = None,
        faults: FaultPolicy | None = None,
    ):
        checkpointing = checkpointing or Checkpointing(None)
        faults = faults or FaultPolicy()
        self.runner = runner
        self.sizer = schedule.sizer
        self.epochs = schedule.epochs
        self.initial_epoch = schedule.initial_epoch
        self.validation_steps = schedule.validation_steps
        self.checkpoint_every = checkpointing.every
        self.resume = checkpointing.resume
        self.faults = faults

        steps_per_epoch = schedule.steps_per_epoch
        self.stream = steps_per_epoch is not None or train.steps >= 0
        self.endless = train.steps == INFINITE
        if steps_per_epoch is None and train.steps >= 0:
            steps_per_epoch = train.steps
            train = train.repeated()
            self.endless = True
        # With gradient accumulation the loop counts applied steps of k batches each.
        self.accumulate = runner.batches_per_step
        steps_per_epoch = accumulation.applied_steps(steps_per_epoch, self.accumulate)
        self.steps_per_epoch = steps_per_epoch
        self.train = train
        self.val_dataset = None
        if schedule.validation is not None:
            self.val_dataset = schedule.validation.distribute()

        verbose = schedule.verbose
        self.callbacks = keras.callbacks.CallbackList(
            list(callbacks) + ([ProgressBar()] if verbose else []),
            add_history=True,
            add_progbar=False,
            model=runner.model,
            verbose=verbose,
            epochs=self.epochs,
            steps=steps_per_epoch,
            batch_size=train.global_batch,
        )
        self.sizer.honour_callbacks(callbacks)  # "auto": one step a loop for per-batch hooks
        self.verbose = verbose
        self.run_shape = {
            "global_batch": train.global_batch,
            "steps_per_epoch": steps_per_epoch,
            **runner.run_shape(),  # optimizer type and hyperparameters, accumulate_steps
            "dataset": train.describe_spec(),
            "input_pipelines": train.pipelines,  # a changed count resumes only a global order
            "input_order": train.order,
        }
        self.ckpt = self._checkpoints(train, checkpointing)
        self.bad_loops = 0
        self.last_saved = None
        self.saveable = False
        self.save_at_epoch_end = False
        self.preempt_at_epoch_end = False
        self.preempted = False
        self.notes: dict = {}  # additions to the settings table (what changed on resume)

    def _checkpoints(self, train: Feed, checkpointing: Checkpointing):
        """The run's `CheckpointState` (None without a directory); the data's fingerprint
        joins the run shape, and a warning names random ops a resume cannot replay."""
        if not checkpointing.enabled:
            return None
        augment_seeds.warn_if_random_state(train.dataset, checkpointing.directory)
        identity = train.fingerprint
        if identity.content is not None:
            self.run_shape["data"] = str(identity)
        else:
            logger.info(
                "The training data's content cannot be fingerprinted (%s): a resumed run "
                "checks only its element shapes and length.",
                identity.how,
            )
        return CheckpointState(
            checkpointing.directory,
            self.runner.strategy,
            checkpointing.keep,
            asynchronous=checkpointing.asynchronous,
            **self.runner.checkpoint_items(),
        )

    def close(self) -> None:
        """Releases the checkpoint directory; `fit` calls it however it ends."""
        if self.ckpt is not None:
            self.ckpt.close()

    # -- input ---------------------------------------------------------------------------

    def _iterator(self, resumed_steps: int = 0):
        """A new iterator over the stream, positioned after `resumed_steps` steps.

        A plain `tf.data` iterator joins the checkpoint (its position is restored);
        a distributed one cannot be saved, so a resumed run skips what was done.
        """
        feed = self.train
        if self.ckpt is not None and self.stream and feed.symbolic_supported():
            feed = feed.symbolic()  # positions, not buffers: exact orders after a restore
        if resumed_steps:
            feed = feed.skipped(resumed_steps * self.accumulate)
            if feed.service is not None:  # not exact: the service restarts the epoch's input
                self.notes["resume"] = RESUME_NOTE
        iterator = iterators.adopt(iter(feed.distribute(endless=self.endless)))
        # A worker's own shard (feed.local_shard) must not be restored from the chief's.
        trackable = isinstance(iterator, tf.__internal__.tracking.Trackable) and not isinstance(
            self.runner.strategy, tf.distribute.MultiWorkerMirroredStrategy
        )
        self.saveable = self.ckpt is not None and self.stream and trackable
        if self.saveable:
            self.ckpt.set("iterator", iterator)
        return iterator

    def _iterator_saveable(self) -> bool:
        """Whether the input iterator can join the checkpoint (asked before making it): a
        plain `tf.data` iterator, which only a strategy that distributes nothing gives, and
        the checkpoint to resume holds one (not when saved on several replicas or workers)."""
        ckpt = self.ckpt
        saveable = ckpt is not None and self.stream and self.train.iterator_saveable()
        return saveable and ckpt.will_restore("iterator", self.resume)

    # -- checkpoints ---------------------------------------------------------------------

    def _restore(self) -> int:
        """Restores the newest readable checkpoint, if any; returns the steps done in this run."""
        path = None
        if self.ckpt is not None:
            # The optimizer's state comes from the checkpoint; its hyperparameters are the user's.
            with self.runner.restoring():
                path = self.ckpt.restore(self.run_shape, self.resume)
        if path is None:
            self.runner.set_position(epoch=self.initial_epoch, epoch_step=0)
            return 0
        done = self._position_after_restore()
        self._announce_resume(path)
        return done

    def _announce_resume(self, path: str) -> None:
        step, epoch, in_epoch = self.runner.position
        where = f"epoch {epoch + 1}/{self.epochs}, step {in_epoch} of it"
        if epoch >= self.epochs:
            where = f"all {self.epochs} epochs done; raise epochs to train on"
        message = (
            f"Resumed from {os.path.basename(path)} in {self.ckpt.directory}: step {step}, {where}."
        )
        changed = {}
        if "optimizer" not in self.ckpt.changed:
            saved = (self.ckpt.saved_shape or {}).get("hyperparameters")
            changed = hyperparameters.changes(saved, self.run_shape["hyperparameters"])
        if changed:
            text = hyperparameters.describe(changed)
            self.notes["changed since the checkpoint"] = text
            message += f" Optimizer settings of this run, not the checkpoint's: {text}."
        if self.ckpt.new_metrics:
            message += (
                f" Metric(s) {', '.join(self.ckpt.new_metrics)} are new to the checkpoint: they "
                "count from zero for the interrupted epoch."
            )
        if self.verbose:
            print(message)
        else:
            logger.info(message)

    def _position_after_restore(self) -> int:
        """Sets the epoch and step within it after a restore; returns the steps done."""
        step, epoch, in_epoch = self.runner.position
        changed = self.ckpt.changed
        if "optimizer" in changed:
            self.runner.restart_optimizer()
        if any(key in changed for key in POSITION_KEYS):
            # resume="force": the data continues after the examples already trained on
            # (skipped), while the interrupted epoch's step count starts again at 0.
            self.runner.reset_metrics()
            self.runner.set_position(epoch=epoch, epoch_step=0)
            batch = self.run_shape["global_batch"]
            old, new = changed.get("global_batch", (batch, batch))
            old_k, new_k = changed.get("accumulate_steps", (self.accumulate, self.accumulate))
            if not (old and new):
                return step
            return -(-step * old * old_k // (new * new_k))  # applied steps of the new shape
        if self.steps_per_epoch is not None and in_epoch >= self.steps_per_epoch:
            epoch, in_epoch = epoch + 1, 0  # a checkpoint of a finished epoch's last step
        self.runner.set_position(epoch=epoch, epoch_step=in_epoch)
        return epoch * (self.steps_per_epoch or 0) + in_epoch

    def _save(self) -> None:
        step = self.runner.position.step
        if self.ckpt is not None and self.last_saved != step:
            self.ckpt.run_shape.value.update(self.runner.run_shape())  # e.g. an on_oom split
            self.ckpt.save(step)
            self.last_saved = step

    # -- the run -------------------------------------------------------------------------

    def run(self) -> keras.callbacks.History:
        # A saveable iterator must exist before the restore, which reads its position. Any
        # other is made after it, once: a second iterator of one dataset would start from the
        # shuffle's next seeds (its seed generator is shared), not the run's first.
        iterator = self._iterator() if self._iterator_saveable() else None
        done_in_run = self._restore()
        if self.stream and (iterator is None or (done_in_run and self._iterator_not_restored())):
            iterator = self._iterator(done_in_run)
        step, start_epoch, in_epoch = self.runner.position
        self.last_saved = step if done_in_run else None
        # Without a stream (unknown length) an interrupted epoch restarts from its start.
        skip_in_epoch = in_epoch if self.stream else 0
        self.runner.model.stop_training = False
        self.callbacks.on_train_begin()
        epoch_logs = {}
        with PreemptionWatcher(self.runner.strategy) as watcher:
            self.watcher = watcher
            for epoch in range(start_epoch, self.epochs):
                first = skip_in_epoch if epoch == start_epoch else 0
                if not first:
                    self.runner.reset_metrics()
                self.callbacks.on_epoch_begin(epoch)
                if not self.stream:
                    iterator = self._iterator()
                status = self._train_epoch(iterator, first)
                if status == "empty":  # nothing to log: no History entry of loss 0
                    self._no_batch(epoch, trained=epoch > start_epoch)
                    break
                if status == "preempted":
                    return self._stop_for_preemption(epoch_logs)
                epoch_logs = self.runner.epoch_logs()
                if self.val_dataset is not None:
                    self.callbacks.on_test_begin()  # as model.fit's validation (e.g. EMA's swap)
                    val_logs = self.runner.evaluate(
                        iterators.adopt(iter(self.val_dataset)), self.validation_steps
                    )
                    self.callbacks.on_test_end(val_logs)
                    epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
                if status == "done":
                    self.runner.set_position(epoch=epoch + 1, epoch_step=0)
                    if self.checkpoint_every == "epoch" or self.save_at_epoch_end:
                        self._save()
                self.save_at_epoch_end = False
                self.callbacks.on_epoch_end(epoch, epoch_logs)
                if self.preempt_at_epoch_end:
                    return self._stop_for_preemption(epoch_logs)
                if status == "exhausted":
                    self._warn_exhausted()
                    break
                if self.runner.model.stop_training:
                    break
            self._save()
            self._wait_for_save()
        self.callbacks.on_train_end(epoch_logs)
        return self.runner.model.history

    def _loop_size(self, done: int) -> int:
        want = self.sizer.next()
        if self.steps_per_epoch is not None:
            want = min(want, self.steps_per_epoch - done)
        if isinstance(self.checkpoint_every, int) and self.ckpt is not None:
            step = self.runner.position.step
            want = min(want, self.checkpoint_every - step % self.checkpoint_every)
        return want

    def _train_epoch(self, iterator, done: int) -> str:
        """Runs one epoch of loops; returns "done", "stopped", "exhausted" or "preempted"."""
        runner = self.runner
        while self.steps_per_epoch is None or done < self.steps_per_epoch:
            want = self._loop_size(done)
            began = time.perf_counter()  # a call's whole host cost: callbacks and logs too
            self.callbacks.on_train_batch_begin(done)
            # Logs, loop loss, example count and the stop vote: one collective per loop.
            result = runner.train(
                iterator, want, stop_flag=self.watcher.signal_received is not None
            )
            ran = result.steps
            if result.note:
                self._announce_out_of_memory(result.note)
            if ran == 0:
                if self.steps_per_epoch is not None:
                    return "exhausted"
                return "empty" if done == 0 else "done"
            done += ran
            runner.set_position(epoch_step=done)
            step = runner.position.step
            if result.nonfinite is not None:
                self._restore_last_good()
                raise TrainingDivergedError(step, variable=result.nonfinite)
            self._check_divergence(result.loop_loss, step)
            logs = dict(result.logs)
            logs["steps"] = ran
            logs["examples_per_second"] = (
                result.examples / result.seconds if result.seconds > 0 else 0.0
            )
            if result.input_wait_s is not None:  # for callbacks.Bottleneck
                logs["input_wait_s"] = result.input_wait_s
            self.callbacks.on_train_batch_end(done - 1, logs)
            seconds = time.perf_counter() - began
            if self.sizer.measuring:  # every worker must choose the same n
                seconds = agreement.agree(runner.strategy, seconds)
            if self.sizer.record(want, ran, seconds):
                self._announce_loop_size()
            epoch_end = self.steps_per_epoch is not None and done >= self.steps_per_epoch
            if (
                isinstance(self.checkpoint_every, int)
                and step % self.checkpoint_every == 0
                and self.bad_loops == 0
            ):
                if epoch_end:  # saved once the epoch is finished: the save belongs to it
                    self.save_at_epoch_end = True
                else:
                    self._save()
            # One worker alone asks its flag now (a signal sent by a callback counts); workers
            # of a cluster use the vote taken with the logs (a later signal counts next loop).
            stop = result.stop_vote
            if stop is None or not self.watcher.multi_worker:
                stop = self.watcher.should_stop()
            if stop:
                if not epoch_end:
                    return "preempted"
                self.preempt_at_epoch_end = True
            if ran < want:
                return "exhausted" if self.steps_per_epoch is not None else "done"
            if epoch_end or self.preempt_at_epoch_end:
                return "done"
            if runner.model.stop_training:
                return "stopped"
        return "done"

    def _restore_last_good(self) -> None:
        """restore_on_divergence: back to this run's last checkpoint, if it has one."""
        if self.faults.restore_on_divergence and self.ckpt is not None and self.ckpt.latest:
            with self.runner.restoring():
                self.ckpt.restore(self.run_shape, "force" if self.resume == "force" else "auto")

    def _iterator_not_restored(self) -> bool:
        ckpt = self.ckpt
        return ckpt is not None and (
            ckpt.iterator_missing or any(key in ckpt.changed for key in ITERATOR_KEYS)
        )

    def _announce_out_of_memory(self, note: str) -> None:
        self.notes["on_oom"] = f"accumulate: {note}"
        logger.warning(note)
        if self.verbose:
            print(note)

    def _announce_loop_size(self) -> None:
        text = self.sizer.describe(self.steps_per_epoch)
        self.notes["steps_per_loop"] = text
        message = f"steps_per_loop: {text}"
        if self.verbose:
            print(message)
        else:
            logger.info(message)

    def _check_divergence(self, loop_loss: float, step: int) -> None:
        if math.isfinite(loop_loss):
            self.bad_loops = 0
            return
        self.bad_loops += 1
        if self.bad_loops >= self.faults.divergence_loops:
            self._restore_last_good()
            raise TrainingDivergedError(step, self.bad_loops, loop_loss)

    def _wait_for_save(self) -> None:
        """The end of `fit` and a preemption: the save in flight is written and published."""
        if self.ckpt is not None:
            self.ckpt.wait()

    def _stop_for_preemption(self, epoch_logs):
        self._save()
        self._wait_for_save()  # only a complete checkpoint lets the process exit 0
        self.preempted = True
        self.callbacks.on_train_end(epoch_logs)
        step = self.runner.position.step
        saved = None
        if self.ckpt is not None and self.last_saved == step and self.ckpt.latest:
            saved = self.ckpt.latest
        faults.stop(self.watcher.signal_received, step, saved, self.faults.exit_on_preemption)
        return self.runner.model.history

    def _no_batch(self, epoch: int, trained: bool) -> None:
        """An epoch of data of unknown length yielded nothing: an error, or the end."""
        if trained:  # e.g. a one-shot generator: as model.fit, stop with a warning
            warnings.warn(
                f"The training data yielded no batch in epoch {epoch + 1}; training stops "
                "here. A dataset of unknown length must yield data on every pass (use a "
                "tf.data source, not a one-shot generator, or set steps_per_epoch and "
                ".repeat()).",
                stacklevel=4,
            )
            return
        raise ValueError(
            f"The training data yielded no batch in epoch {epoch + 1}. Its length is "
            "unknown, so this shows only now: a filter that keeps nothing, or a source with "
            "no records? Check it with next(iter(dataset))."
        )

    def _warn_exhausted(self):
        warnings.warn(
            f"The training data ran out after {self.runner.position.step} steps, before "
            f"{self.epochs} epochs of {self.steps_per_epoch} steps; add .repeat() to the "
            "dataset or lower steps_per_epoch.",
            stacklevel=4,
        )
