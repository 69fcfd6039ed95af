"""Every exception and warning tfaccel raises or warns with, in one module.

Each is also importable from the module that uses it (`tfaccel.train`, `tfaccel.data`,
`tfaccel.cluster`, ...; the same class object). Catch one with
`except tfaccel.errors.CheckpointLockedError`, silence one with
`warnings.simplefilter("ignore", tfaccel.errors.DroppedExamplesWarning)`.

Plain Python: this module imports nothing.
"""

from __future__ import annotations

__all__ = [
    "CacheBusyWarning",
    "CacheMismatchError",
    "CacheMismatchWarning",
    "CheckFailed",
    "CheckpointCorruptError",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "ClusterMismatchWarning",
    "DeviceConfigError",
    "DroppedExamplesWarning",
    "LRScalingWarning",
    "NoBatchSizeFitsError",
    "PeersMissingError",
    "PortInUseError",
    "ServiceError",
    "Skip",
    "SlurmAllocationWarning",
    "SplitError",
    "StaleCacheWarning",
    "TrainingDivergedError",
    "Untrusted",
]

# -- training (tfaccel.train) ---------------------------------------------------------------


class TrainingDivergedError(RuntimeError):
    """The loss stayed non-finite for too many step loops, or a weight became non-finite.

    Attributes:
        step: the global step after which divergence was seen.
        variable: the first non-finite trainable variable (its path), or None when the
            loss diverged.
    """

    def __init__(self, step: int, loops: int = 0, loss: float = float("nan"), *, variable=None):
        self.step = step
        self.variable = variable
        if variable is None:
            message = (
                f"Training diverged: the loss was {loss} for {loops} consecutive step loops, "
                f"up to step {step}."
            )
        else:
            message = (
                f"Training diverged: the trainable variable {variable!r} holds NaN or inf "
                f"after step {step} (the reported loss may still look finite). No checkpoint "
                "was written with these weights."
            )
        super().__init__(
            f"{message} The last good checkpoint was left intact. Check the data for inf/NaN "
            "(tfaccel.data.pipeline(..., check_finite=True) names the element), lower the "
            "learning rate, or use loss scaling (mixed_float16) correctly."
        )


class CheckpointMismatchError(ValueError):
    """The checkpoint directory holds a checkpoint of a different model or run shape."""


class CheckpointCorruptError(RuntimeError):
    """Every checkpoint in the checkpoint directory is unreadable (truncated, missing files)."""


class CheckpointLockedError(RuntimeError):
    """Another run holds the checkpoint directory (see `tfaccel.train.state.lock`)."""


class DroppedExamplesWarning(UserWarning):
    """Training examples left out of every epoch by `drop_remainder=True`."""


# -- input (tfaccel.data) -------------------------------------------------------------------


class CacheBusyWarning(UserWarning):
    """Another process is filling this file cache: this pipeline reads without it."""


class StaleCacheWarning(UserWarning):
    """A file cache left locked by an interrupted run was removed."""


class CacheMismatchWarning(UserWarning):
    """A file cache built from other data was removed; it is rebuilt."""


class CacheMismatchError(ValueError):
    """A file cache was built from other data (with `cache_mismatch="error"`)."""


class ServiceError(RuntimeError):
    """A tf.data service could not be started, or its dispatcher is gone."""


class PortInUseError(OSError):
    """The port a server was asked to listen on is taken."""


# -- devices and clusters (tfaccel.devices, tfaccel.cluster, the launcher) -----------------


class DeviceConfigError(RuntimeError):
    """The requested device configuration cannot be applied on this machine now."""


class SlurmAllocationWarning(UserWarning):
    """A Slurm allocation of several tasks, but no job step: this process runs alone."""


class ClusterMismatchWarning(UserWarning):
    """TF_CONFIG and Slurm both describe a cluster, with different worker counts."""


class PeersMissingError(RuntimeError):
    """Some workers of the cluster never came within the startup timeout."""


# -- tuning and model parallelism (tfaccel.tuning, tfaccel.parallel) -----------------------


class NoBatchSizeFitsError(RuntimeError):
    """Not even the smallest batch tried fits in memory."""


class LRScalingWarning(UserWarning):
    """lr_scaling="auto" met an optimizer it does not know: the rule it chose and why."""


class SplitError(ValueError):
    """A model that cannot be cut into the requested pipeline stages."""


# -- files others may have written (tfaccel.files) ------------------------------------------


class Untrusted(Exception):
    """A file refused by `tfaccel.files.trusted.read_trusted`; the message says why (e.g.
    "mode 0666: writable by its group or others")."""


# -- the self-test (tfaccel.check) ---------------------------------------------------------


class Skip(Exception):
    """Raised by a check that cannot run here; the message says why."""


class CheckFailed(AssertionError):
    """Raised by a check whose measurement is wrong; the message says what was found.

    Attributes:
        figure: the measured figure, as the table shows it ("" when none).
        value: the measured number, or None.
    """

    def __init__(self, message: str, figure: str = "", value: float | None = None):
        super().__init__(message)
        self.figure, self.value = figure, value
