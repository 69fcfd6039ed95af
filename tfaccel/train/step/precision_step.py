"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.moved`)."""

from tfaccel import moved

__getattr__ = moved.forward(
    "tfaccel.train.step.precision_step",
    "tfaccel.choices.policy",
    "tfaccel.choices.timing",
    "tfaccel.choices.copies",
)
