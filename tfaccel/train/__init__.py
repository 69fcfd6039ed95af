"""The Trainer: custom multi-step `tf.function` training under any `tf.distribute` strategy."""

from tfaccel.train.checkpoint import CheckpointCorruptError, CheckpointMismatchError
from tfaccel.train.faults import TrainingDivergedError
from tfaccel.train.lock import CheckpointLockedError
from tfaccel.train.remainder import DroppedExamplesWarning
from tfaccel.train.trainer import Trainer

__all__ = [
    "CheckpointCorruptError",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "DroppedExamplesWarning",
    "Trainer",
    "TrainingDivergedError",
]
