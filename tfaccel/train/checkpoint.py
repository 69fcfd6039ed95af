"""Checkpoint and resume: global step, epoch, model, optimizer, metrics and input position.

Only the chief writes the real checkpoint; other workers of a multi-worker job must
take part in the save (it is a collective) and write to a private temporary
directory, which they delete afterwards. `tf.train.CheckpointManager` updates its
state file only after a checkpoint is fully written, so a crash during a save
leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import os
import shutil

import tensorflow as tf


class CheckpointMismatchError(ValueError):
    """The checkpoint directory holds a checkpoint of a different model or trainer."""


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this process is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief"
    return resolver.task_type == "worker" and resolver.task_id == 0


class CheckpointState:
    """Manages the checkpoints of one `fit` call.

    Args:
        directory: where checkpoints live.
        strategy: the trainer's strategy (decides who writes for real).
        keep: how many checkpoints to keep.
        **objects: trackables to save (model, optimizer, step, epoch, iterator...).
    """

    def __init__(self, directory: str, strategy, keep: int = 3, **objects):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}.")
        self.directory = os.fspath(directory)
        self.chief = is_chief(strategy)
        self.checkpoint = tf.train.Checkpoint(**objects)
        write_dir = self.directory
        if not self.chief:
            task_id = strategy.cluster_resolver.task_id
            write_dir = os.path.join(self.directory, f".worker{task_id}-tmp")
        self._write_dir = write_dir
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, write_dir, max_to_keep=keep, step_counter=objects.get("step")
        )

    def set(self, name: str, trackable) -> None:
        """Replaces a saved object (e.g. a new input iterator)."""
        setattr(self.checkpoint, name, trackable)

    def restore(self) -> str | None:
        """Restores the chief's latest checkpoint; returns its path, or None when there is none.

        Raises:
            CheckpointMismatchError: the checkpoint does not match this model/trainer.
        """
        path = tf.train.latest_checkpoint(self.directory)
        if path is None:
            return None
        try:
            status = self.checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as error:
            raise CheckpointMismatchError(
                f"{self.directory} holds a checkpoint ({os.path.basename(path)}) that does not "
                "match this model and trainer (different layers, shapes or optimizer), so it "
                "cannot be resumed. Use a new checkpoint_dir, or delete the old one to start "
                f"over. Details: {str(error).splitlines()[0][:400]}"
            ) from error
        return path

    def save(self, step: int) -> str:
        """Writes a checkpoint at `step` (every worker must call it)."""
        path = self.manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self._write_dir, ignore_errors=True)
        return path

    @property
    def latest(self) -> str | None:
        return tf.train.latest_checkpoint(self.directory)
