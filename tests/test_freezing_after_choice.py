"""A method's retrace reaches the step loops that train: the runner "auto" makes anew
(here XLA chosen) is the one LayerFreezing freezes, not the one it replaced."""

import keras
import numpy as np
import tensorflow as tf
from test_xla_auto import EPOCHS, STEPS, data, fake_timer

import tfaccel
from tfaccel import methods


class Snapshot(keras.callbacks.Callback):
    """The first Dense layer's kernel at each epoch's start."""

    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_epoch_begin(self, epoch, logs=None):
        self.kernels.append(np.array(self.model.layers[0].kernel))


def build():
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2),
        ]
    )


def test_layer_freezing_freezes_the_loops_the_xla_choice_made(monkeypatch):
    fake_timer(monkeypatch, plain_s=10.0, xla_s=5.0)  # "auto" picks XLA: a new runner
    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=50,
        methods=[methods.LayerFreezing(start=0.5, fraction=0.5)],
    )
    snapshot = Snapshot()
    trainer.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0, callbacks=[snapshot])
    assert trainer.jit_compile is True  # the runner was made anew after the methods
    frozen_from = snapshot.kernels[1]  # frozen at the start of the second epoch
    np.testing.assert_array_equal(np.array(trainer.model.layers[0].kernel), frozen_from)
    assert not np.array_equal(snapshot.kernels[0], snapshot.kernels[1])  # it trained before
