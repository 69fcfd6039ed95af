"""Layer freezing: the early layers stop training for the last part of the job.

Early layers settle first; freezing them saves their backward pass and their update.
From `start` (a share of the epochs) on, the first `fraction` of the model's layers with
trainable weights get `trainable = False`, and the training step is traced again (once).
Which layers are frozen is a function of the epoch, so a resumed run freezes the same.
A frozen `BatchNormalization` runs in inference mode (Keras' rule for frozen layers).
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from tfaccel.methods.base import Card, Job, Method, MethodPlan


def weighted_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The model's layers with trainable weights, in order (nested models flattened)."""
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += weighted_layers(layer)
        elif layer.trainable_weights:
            found.append(layer)
    return found


class FreezeEarlyLayers(keras.callbacks.Callback):
    """At each epoch's start, freezes `count` early layers once the epoch reaches `at`.

    With `model.fit` the training function is made again after freezing (Keras traces
    the trainable variables into it); the Trainer gives `retrace`.
    """

    def __init__(
        self, layers: list[keras.layers.Layer], at: int, retrace: Callable[[], None] | None = None
    ):
        super().__init__()
        self.layers, self.at, self.retrace = layers, at, retrace
        self.frozen_at: int | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if epoch < self.at or self.frozen_at is not None:
            return
        for layer in self.layers:
            layer.trainable = False
        self.frozen_at = epoch
        if self.retrace is not None:
            self.retrace()
        elif hasattr(self.model, "make_train_function"):
            self.model.make_train_function(force=True)

    def on_train_end(self, logs: dict | None = None) -> None:
        for layer in self.layers:  # the model as given: trainable again for the next fit
            layer.trainable = True


class LayerFreezing(Method):
    """Freezes the first `fraction` of the weighted layers from `start` of the epochs on.

    Args:
        start: the share of the epochs after which the early layers freeze, in (0, 1).
        fraction: the share of the weighted layers frozen, in (0, 1).

    Raises:
        ValueError: start or fraction outside (0, 1); at `check`, a job too short to
            freeze before its last epoch, or a model with too few layers.
    """

    name = "layer freezing"
    card = Card(
        changes=(
            "which weights train: the first `fraction` of the weighted layers freeze from "
            "`start` of the epochs on (one retrace)"
        ),
        helps=(
            "models with large early layers, whose backward pass and update it saves (not "
            "measured here: these models have none)"
        ),
        hurts=(
            "models whose early layers are much of what learns (the GRU, half the model, "
            'never reached its target); does not stack with EMA; not in `"fast"`'
        ),
        measured=(
            "Epochs 1.11× (CNN), 1.00× (table); never reached the GRU's target (the GRU is "
            "half the model)."
        ),
        defaults="start=0.5, fraction=0.5, the setting measured (not set by a measurement)",
        measured_as="LayerFreezing(0.5, 0.5)",
        contender="layer_freezing",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, start: float = 0.5, fraction: float = 0.5):
        for value, what in ((start, "start"), (fraction, "fraction")):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"LayerFreezing {what} must be a number in (0, 1).")
            if not 0 < value < 1:
                raise ValueError(f"LayerFreezing {what} must be in (0, 1), got {value}.")
        self.start, self.fraction = float(start), float(fraction)

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return (
            f"which weights train: the first {self.fraction:.0%} of the layers freeze after "
            f"{self.start:.0%} of the epochs"
        )

    def frozen_layers(self, model: keras.Model) -> list[keras.layers.Layer]:
        """The first `fraction` of the model's layers with trainable weights."""
        layers = weighted_layers(model)
        return layers[: int(len(layers) * self.fraction)]

    def first_frozen_epoch(self, job: Job) -> int:
        """The epoch at whose start the layers freeze: `start` of the epochs, at least 1."""
        return max(1, int(round(self.start * job.epochs)))

    def check(self, job: Job) -> None:
        if self.first_frozen_epoch(job) >= job.epochs:
            raise ValueError(
                f"LayerFreezing(start={self.start}) on a job of {job.epochs} epochs would "
                "freeze nothing before the end (layers freeze at an epoch's start). Use a "
                "smaller start or more epochs."
            )
        if not self.frozen_layers(job.model):
            raise ValueError(
                f"LayerFreezing(fraction={self.fraction}) freezes no layer of a model with "
                f"{len(weighted_layers(job.model))} weighted layers; raise the fraction."
            )

    def apply(self, plan: MethodPlan) -> None:
        job = plan.job
        layers = self.frozen_layers(job.model)
        plan.callbacks.append(FreezeEarlyLayers(layers, self.first_frozen_epoch(job)))
