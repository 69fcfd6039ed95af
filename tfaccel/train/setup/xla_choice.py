"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.choices.moved`)."""

from tfaccel.choices import moved

__getattr__ = moved.forward(
    "tfaccel.train.setup.xla_choice", "tfaccel.choices.xla", "tfaccel.choices.timing"
)
