"""What `fit` does about checkpoints and faults, as two small validated values.

`Checkpointing` (where, how often, how many, whether to resume) and `FaultPolicy`
(divergence, preemption) are frozen dataclasses that check their values when made,
with the messages `Trainer.fit` gives for its `checkpoint_*`, `keep`, `resume`,
`divergence_loops`, `restore_on_divergence` and `exit_on_preemption` arguments. What
needs the file system (a file as the directory, no write permission, another run's
lock) is checked where checkpoints are opened, before the first step.
"""

from __future__ import annotations

import dataclasses
import os

RESUME_MODES = ("auto", "force", "never")
"""What `resume` accepts (see `Trainer.fit`)."""


def check_checkpoint_every(value: object) -> int | str:
    """Returns `value` ("epoch" or an int >= 1) or raises ValueError."""
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"checkpoint_every must be 'epoch' or an integer >= 1 step, got {value!r}.")


def check_resume(value: object) -> str:
    """Returns `value` (one of `RESUME_MODES`) or raises ValueError."""
    if isinstance(value, str) and value in RESUME_MODES:
        return value
    raise ValueError(
        f"resume must be one of {RESUME_MODES}, got {value!r}: 'auto' refuses a "
        "checkpoint of a run with another global batch, steps per epoch, optimizer, "
        "accumulate_steps or training data; 'force' accepts it; 'never' starts from "
        "step 0."
    )


def check_keep(value: object) -> int:
    """Returns `value` (an int >= 1) or raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"keep must be an integer >= 1, got {value!r}.")
    return value


def check_directory_named(directory: str | os.PathLike[str]) -> str:
    """Returns `directory` as a string; raises ValueError for "" (an unset variable?)."""
    directory = os.fspath(directory)
    if not directory:
        raise ValueError(
            "checkpoint_dir is an empty string (an unset environment variable?); it would "
            "write checkpoints into the working directory and rotate and clean up files "
            "there. Pass a directory path, or checkpoint_dir=None for no checkpoints."
        )
    return directory


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how often `fit` saves, how many checkpoints it keeps, whether it resumes.

    Attributes:
        directory: the checkpoint directory (a path string; `os.PathLike` is converted),
            or None: no checkpoints (`keep` is then not checked, as `fit` does not).
        every: "epoch" or a number of applied steps >= 1.
        keep: how many checkpoints to keep (>= 1).
        resume: "auto", "force" or "never" (see `Trainer.fit`).
        asynchronous: write checkpoint files on a background thread; the step loop
            waits only while the state is copied to host memory (see
            `checkpoint.CheckpointState`). Multi-worker jobs always save synchronously.

    Raises:
        ValueError: `every` neither "epoch" nor an integer >= 1, `resume` not one of
            `RESUME_MODES`, `directory` "", `keep` not an integer >= 1, or
            `asynchronous` not True/False.
        TypeError: `directory` neither None, a string nor a path.
    """

    directory: str | os.PathLike[str] | None  # a str once made
    every: int | str = "epoch"
    keep: int = 3
    resume: str = "auto"
    asynchronous: bool = True

    def __post_init__(self):
        check_checkpoint_every(self.every)
        check_resume(self.resume)
        _check_bool("asynchronous", self.asynchronous)
        if self.directory is not None:
            object.__setattr__(self, "directory", check_directory_named(self.directory))
            check_keep(self.keep)

    @property
    def enabled(self) -> bool:
        """Whether checkpoints are written (a directory was given)."""
        return self.directory is not None


@dataclasses.dataclass(frozen=True)
class FaultPolicy:
    """What `fit` does when the loss diverges or the process is asked to stop.

    Attributes:
        divergence_loops: raise `TrainingDivergedError` after this many consecutive step
            loops with a non-finite loss (an integer >= 1).
        restore_on_divergence: restore the last good checkpoint before raising.
        exit_on_preemption: after SIGTERM/SIGINT, save and exit (True) or return from
            `fit` with `trainer.preempted` set (False).

    Raises:
        ValueError: `divergence_loops` not an integer >= 1, or a flag not True/False.
    """

    divergence_loops: int = 3
    restore_on_divergence: bool = False
    exit_on_preemption: bool = True

    def __post_init__(self):
        loops = self.divergence_loops
        if isinstance(loops, bool) or not isinstance(loops, int) or loops < 1:
            raise ValueError(f"divergence_loops must be an integer >= 1, got {loops}.")
        _check_bool("restore_on_divergence", self.restore_on_divergence)
        _check_bool("exit_on_preemption", self.exit_on_preemption)
