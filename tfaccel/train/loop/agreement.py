"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.choices.moved`)."""

from tfaccel.choices import moved

__getattr__ = moved.forward("tfaccel.train.loop.agreement", "tfaccel.choices.agreement")
