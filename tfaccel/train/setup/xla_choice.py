"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.moved`)."""

from tfaccel import moved

__getattr__ = moved.forward(
    "tfaccel.train.setup.xla_choice", "tfaccel.choices.xla", "tfaccel.choices.timing"
)
