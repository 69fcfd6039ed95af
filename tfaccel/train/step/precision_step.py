"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.choices.moved`)."""

from tfaccel.choices import moved

__getattr__ = moved.forward(
    "tfaccel.train.step.precision_step",
    "tfaccel.choices.step_policy",
    "tfaccel.choices.copies",
    "tfaccel.choices.timing",
)
