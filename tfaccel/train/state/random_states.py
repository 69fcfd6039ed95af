"""The model's random states a checkpoint holds: Keras' `SeedGenerator` states (Dropout,
random augmentation layers, `tfaccel.blocks` stochastic depth), so that a resumed run
draws what an uninterrupted one would have drawn."""

from __future__ import annotations

from typing import Any

import keras

STATE_NAME = "seed_generator_state"


def of(model: keras.Model | None) -> list[Any]:
    """The model's seed-generator state variables, in the model's order (empty: none)."""
    if model is None:
        return []
    return [v for v in model.variables if v.name == STATE_NAME]


def paths(states: list[Any] | None) -> set[str]:
    """The variables' paths, as a checkpoint's "unmatched" message names them."""
    return {getattr(v, "path", v.name) for v in states or ()}


def missing_note(unmatched: set[str]) -> str:
    """Why a resume from a checkpoint without the model's random states is not exact."""
    return (
        f"The checkpoint holds no random state for {', '.join(sorted(unmatched))} (it was "
        "saved by an earlier tfaccel): the resumed run's random draws (Dropout, random "
        "augmentation) differ from those of an uninterrupted run."
    )
