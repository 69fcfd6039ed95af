"""The Trainer: custom multi-step `tf.function` training under any `tf.distribute` strategy."""

from tfaccel.train.loop.faults import TrainingDivergedError
from tfaccel.train.setup.remainder import DroppedExamplesWarning
from tfaccel.train.state.checkpoint import CheckpointCorruptError, CheckpointMismatchError
from tfaccel.train.state.lock import CheckpointLockedError
from tfaccel.train.trainer import Trainer

__all__ = [
    "CheckpointCorruptError",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "DroppedExamplesWarning",
    "Trainer",
    "TrainingDivergedError",
]
