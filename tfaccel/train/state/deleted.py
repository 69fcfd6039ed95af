"""Checkpoint files deleted under a running job (a cleanup, another process): said, and
the job goes on.

A save whose files vanish while it is written (TensorFlow's `NotFoundError` from its
temporary folder, or files gone right after the write) is written again, up to
`WRITE_ATTEMPTS` times (once in a multi-worker job, whose saves every worker takes part
in), then given up with a warning (training goes on; the next save
tries again). Before each save, `check` names what this run saved or holds there and is
gone since (its last checkpoint, its lock file, which it takes again), and the save
writes a fresh checkpoint. Only when the lock file is gone *and* checkpoints this run did
not write appeared does it stop (`CheckpointLockedError`): another run may save there.
"""

from __future__ import annotations

import warnings
from typing import Protocol

import tensorflow as tf

from tfaccel.errors import CheckpointLockedError
from tfaccel.train.state import checkpoint_files as files
from tfaccel.train.state.lock import NAME as LOCK_NAME
from tfaccel.train.state.lock import DirectoryLock

WRITE_ATTEMPTS = 3
"""Writes of one checkpoint whose files are deleted under it before it is given up."""


def vanished(error: BaseException) -> bool:
    """Whether a write failed because a file or folder it made was deleted under it."""
    if isinstance(error, (tf.errors.NotFoundError, FileNotFoundError)):
        return True
    text = str(error)
    return "No such file or directory" in text or "NOT_FOUND" in text


def rewritten(step: int, directory: str, why: str) -> str:
    return (
        f"Checkpoint {step}'s files in checkpoint_dir {directory!r} were deleted while it "
        f"was being saved ({why}); wrote it again."
    )


def given_up(step: int, directory: str, why: str, attempts: int) -> str:
    return (
        f"Checkpoint {step}'s files in checkpoint_dir {directory!r} were deleted while it was "
        f"written ({attempts} time(s), last: {why}); is another process deleting files "
        "there? Training goes on without this checkpoint; the next save tries again."
    )


class Saves(Protocol):
    """What `check` knows of a `checkpoint.CheckpointState`."""

    chief: bool  # this worker writes the real checkpoint
    directory: str
    published: int | None  # the last checkpoint this run published (None: said gone)
    lock: DirectoryLock | None  # the chief's lock of the directory
    written: set[int]  # every checkpoint this run published
    found: set[int]  # the checkpoints there when the run began


def check(state: Saves, step: int) -> None:
    """Says what `state` (a `CheckpointState`) saved or holds in its directory and was
    deleted since its last save; takes its lock again.

    Raises:
        CheckpointLockedError: the lock file is gone and checkpoints this run did not
            write are there (another run may have saved there).
    """
    if not state.chief or "://" in state.directory:
        return
    gone = []
    if state.published is not None and not files.complete(state.directory, state.published):
        gone.append(f"{files.PREFIX}-{state.published}, the last checkpoint this run saved")
    lock = state.lock
    lost = lock if lock is not None and lock.missing() else None  # its file is gone
    if lost is not None:
        foreign = sorted(set(files.numbers(state.directory)) - state.written - state.found)
        if foreign:
            names = ", ".join(f"{files.PREFIX}-{n}" for n in foreign)
            raise CheckpointLockedError(
                f"This run's lock file {lost.path} is gone and {state.directory} holds "
                f"checkpoint(s) this run did not write ({names}): another run may be saving "
                "there, so this one does not. Use another checkpoint_dir."
            )
        gone.append(f"the lock file {LOCK_NAME}")
    if not gone:
        return
    again = "took the lock again and " if lost is not None else ""
    warnings.warn(
        f"Files of checkpoint_dir {state.directory!r} were deleted while this run trained "
        f"({'; '.join(gone)}). Training goes on: {again}saving checkpoint {step} there now.",
        stacklevel=5,
    )
    state.published = None
    if lost is not None:
        lost.retake()
