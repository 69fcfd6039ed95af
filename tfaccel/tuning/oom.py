"""Out-of-memory for the tuners: recognised as the Trainer does, and memory released
between probes. The recognition and the retry live in `tfaccel.train.step.out_of_memory`."""

from __future__ import annotations

import keras

from tfaccel.train.step.out_of_memory import (
    describe_out_of_memory,
    is_out_of_memory,
    split_until_fits,
)

__all__ = ["describe_out_of_memory", "is_out_of_memory", "release_memory", "split_until_fits"]


def release_memory() -> None:
    """Drops Keras' global state and collects garbage so freed tensors go back to the device.

    One garbage collection (inside `clear_session`): with TensorFlow loaded each costs
    a noticeable fraction of a second.
    """
    keras.backend.clear_session(free_memory=True)
