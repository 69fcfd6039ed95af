"""The run's checkpoints as the outer loop uses them: when it saves, what a resume restores
and says, and the last good state after a divergence.

Saves land on `checkpoint_every` boundaries (a step loop never crosses one: `clip`) and
at epoch ends. A save that lands on an epoch's last step waits until the epoch is
finished (validation run, epoch counter advanced, the callbacks' `on_epoch_end` run), so
it belongs to that epoch: a resumed run never logs an epoch of zero steps, and it keeps
what those callbacks changed (a rate `ReduceLROnPlateau` lowered, `Plateau`'s decay).
An epoch's checkpoint an earlier tfaccel wrote (before its callbacks) still loads: its
resumed run lacks only that epoch end's changes. The files, their identity checks and the lock are
`tfaccel.train.state.checkpoint.CheckpointState`'s.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfaccel.data.order import augment_seeds
from tfaccel.train.loop.notes import Notes
from tfaccel.train.state import hyperparameters
from tfaccel.train.state.batch_stages import RECORD_KEY, BatchStages
from tfaccel.train.state.checkpoint import ITERATOR_KEYS, POSITION_KEYS, CheckpointState
from tfaccel.train.state.policies import Checkpointing

if TYPE_CHECKING:
    from tfaccel.data import Feed
    from tfaccel.train.step.runner_interface import Batches, RunnerInterface

logger = logging.getLogger("tfaccel")


class Checkpoints:
    """Saving and resuming one `fit` (nothing at all without a checkpoint directory).

    Args:
        runner: the inner loop (`runner_interface.RunnerInterface`).
        train: the training `Feed` (its fingerprint joins `run_shape`).
        checkpointing: where and when to save, how to resume (`policies.Checkpointing`).
        run_shape: what a resume must share with the saved run (kept and updated here).
        notes: where a resume's changes are said.
        stages: the progressive batch's stages (None: one batch): each save records the
            stage and the data's position in start batches; a resume reads it.

    Attributes:
        state: the `CheckpointState`, or None without a directory.
        last_saved: the global step of this run's last save (None: none yet).
    """

    def __init__(
        self,
        runner: RunnerInterface,
        train: Feed,
        checkpointing: Checkpointing,
        run_shape: dict[str, Any],
        notes: Notes,
        stages: BatchStages | None = None,
    ) -> None:
        self.runner = runner
        self.stages = stages
        self.every = checkpointing.every
        self.resume = checkpointing.resume
        self.run_shape = run_shape
        self.notes = notes
        self.state = self._open(train, checkpointing)
        self.last_saved: int | None = None
        self.deferred = False  # a save on an epoch's last step, written once it is finished

    def _open(self, train: Feed, checkpointing: Checkpointing) -> CheckpointState | None:
        """The run's `CheckpointState` (None without a directory); the data's fingerprint
        joins the run shape, and a warning names random ops a resume cannot replay."""
        if checkpointing.directory is None:  # not `enabled`
            return None
        directory = os.fspath(checkpointing.directory)  # a str already (`Checkpointing`)
        augment_seeds.warn_if_random_state(train.dataset, directory)
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
            directory,
            self.runner.strategy,
            checkpointing.keep,
            asynchronous=checkpointing.asynchronous,
            **self.runner.checkpoint_items(),
        )

    @property
    def enabled(self) -> bool:
        """Whether the run has a checkpoint directory."""
        return self.state is not None

    def close(self) -> None:
        """Releases the checkpoint directory; `fit` calls it however it ends."""
        if self.state is not None:
            self.state.close()

    # -- the input iterator ----------------------------------------------------------------

    def will_restore_iterator(self) -> bool:
        """Whether the checkpoint to resume holds an input iterator (not when saved on
        several replicas or workers)."""
        return self.state is not None and self.state.will_restore("iterator", self.resume)

    def track_iterator(self, iterator: Batches) -> None:
        """Saves `iterator`'s position with the run when it can be: a plain `tf.data`
        iterator, not a worker's own shard (which must not be restored from the chief's)."""
        trackable = isinstance(iterator, tf.__internal__.tracking.Trackable) and not isinstance(
            self.runner.strategy, tf.distribute.MultiWorkerMirroredStrategy
        )
        if self.state is not None and trackable:
            self.state.set("iterator", iterator)

    def iterator_not_restored(self) -> bool:
        """After a restore: the input iterator was not (the checkpoint lacks one, or the
        batching changed), so the input skips to the position instead."""
        state = self.state
        return state is not None and (
            state.iterator_missing or any(key in state.changed for key in ITERATOR_KEYS)
        )

    # -- resume ----------------------------------------------------------------------------

    def restore(self, *, epochs: int, initial_epoch: int, steps_per_epoch: int | None) -> int:
        """Restores the newest readable checkpoint, if any, and sets the runner's position;
        returns the applied steps done in this run's shape (0: a fresh start); with batch
        stages, the batches of the start size read."""
        path, state = None, self.state
        if state is not None:
            # The optimizer's state comes from the checkpoint; its hyperparameters are the user's.
            with self.runner.restoring():
                path = state.restore(self.run_shape, self.resume)
        if state is None or path is None:
            self.runner.set_position(epoch=initial_epoch, epoch_step=0)
            return 0
        done = self._position_after_restore(state, steps_per_epoch)
        self._announce(state, path, epochs)
        self.last_saved = self.runner.position.step if done else None  # saved as restored
        return done

    def _position_after_restore(self, state: CheckpointState, steps_per_epoch: int | None) -> int:
        """Sets the epoch and step within it after a restore; returns the steps done."""
        step, epoch, in_epoch = self.runner.position
        changed = state.changed
        if "optimizer" in changed:
            self.runner.restart_optimizer()
        if any(key in changed for key in POSITION_KEYS):
            # resume="force": the data continues after the examples already trained on
            # (skipped), while the interrupted epoch's step count starts again at 0.
            self.runner.reset_metrics()
            self.runner.set_position(epoch=epoch, epoch_step=0)
            batch = self.run_shape["global_batch"]
            k = self.runner.batches_per_step
            old, new = changed.get("global_batch", (batch, batch))
            old_k, new_k = changed.get("accumulate_steps", (k, k))
            if not (old and new):
                return step
            return -(-step * old * old_k // (new * new_k))  # applied steps of the new shape
        if self.stages is not None:
            steps_per_epoch = self.stages.steps_in(epoch)
        if steps_per_epoch is not None and in_epoch >= steps_per_epoch:
            epoch, in_epoch = epoch + 1, 0  # a checkpoint of a finished epoch's last step
        if self.stages is not None:
            return self._stage_after_restore(state, epoch, in_epoch)
        self.runner.set_position(epoch=epoch, epoch_step=in_epoch)
        return epoch * (steps_per_epoch or 0) + in_epoch

    def _stage_after_restore(self, state: CheckpointState, epoch: int, in_epoch: int) -> int:
        """With batch stages: the position of the batches the checkpoint read (its record,
        or one start batch a step without one); returns them."""
        assert self.stages is not None
        saved = (state.saved_shape or {}).get(RECORD_KEY)
        batches, step = self.stages.resumed(epoch, in_epoch, saved)
        restored, epoch = (epoch, in_epoch), batches // self.stages.steps_per_epoch
        if (epoch, step) != restored or saved is None:
            self.notes.table["batch stage on resume"] = (
                f"{batches} batches of {self.stages.batch} read ("
                f"{'no stage recorded' if saved is None else 'recorded stage: ' + str(saved)})"
                f"; this run goes on at epoch {epoch + 1}, step {step}, batch "
                f"{self.stages.factor(epoch) * self.stages.batch}"
            )
        self.runner.set_position(epoch=epoch, epoch_step=step)
        return batches

    def _announce(self, state: CheckpointState, path: str, epochs: int) -> None:
        step, epoch, in_epoch = self.runner.position
        where = f"epoch {epoch + 1}/{epochs}, step {in_epoch} of it"
        if epoch >= epochs:
            where = f"all {epochs} epochs done; raise epochs to train on"
        message = (
            f"Resumed from {os.path.basename(path)} in {state.directory}: step {step}, {where}."
        )
        changed = {}
        if "optimizer" not in state.changed:
            saved = (state.saved_shape or {}).get("hyperparameters")
            changed = hyperparameters.changes(saved, self.run_shape["hyperparameters"])
        if changed:
            text = hyperparameters.describe(changed)
            self.notes.table["changed since the checkpoint"] = text
            message += f" Optimizer settings of this run, not the checkpoint's: {text}."
        if state.new_metrics:
            message += (
                f" Metric(s) {', '.join(state.new_metrics)} are new to the checkpoint: they "
                "count from zero for the interrupted epoch."
            )
        self.notes.say(message)

    def restore_last_good(self) -> None:
        """`restore_on_divergence`: back to this run's last checkpoint, if it has one."""
        if self.state is not None and self.state.latest:
            with self.runner.restoring():
                self.state.restore(self.run_shape, "force" if self.resume == "force" else "auto")

    # -- saves -----------------------------------------------------------------------------

    def clip(self, want: int) -> int:
        """`want` steps, cut at the next `checkpoint_every` boundary."""
        if isinstance(self.every, int) and self.state is not None:
            step = self.runner.position.step
            want = min(want, self.every - step % self.every)
        return want

    def after_loop(self, step: int, epoch_end: bool) -> None:
        """A loop ended at global `step`: saves on a `checkpoint_every` boundary (deferred
        to the epoch's end when it is the epoch's last step)."""
        if isinstance(self.every, int) and step % self.every == 0:
            if epoch_end:  # saved once the epoch is finished: the save belongs to it
                self.deferred = True
            else:
                self.save()

    def epoch_ended(self, finished: bool) -> None:
        """The epoch's end, after its callbacks' `on_epoch_end` (`finished`: all its
        steps ran, the position is the next epoch's): its save, if one is due."""
        if finished and (self.every == "epoch" or self.deferred):
            self.save()
        self.deferred = False

    def save(self) -> None:
        """Saves at the runner's step (once per step)."""
        step = self.runner.position.step
        if self.state is not None and self.last_saved != step:
            self.state.run_shape.value.update(self.runner.run_shape())  # e.g. an on_oom split
            if self.stages is not None:
                _, epoch, in_epoch = self.runner.position
                self.state.run_shape.value[RECORD_KEY] = self.stages.record(epoch, in_epoch)
            self.state.save(step)
            self.last_saved = step

    def wait(self) -> None:
        """The end of `fit` and a preemption: the save in flight is written and published."""
        if self.state is not None:
            self.state.wait()

    def saved_at(self, step: int) -> str | None:
        """The checkpoint holding global `step`, or None when it was not saved."""
        if self.state is not None and self.last_saved == step and self.state.latest:
            return self.state.latest
        return None
