"""The range test puts back every layer's random state, and names non-finite inputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import tuning

RNG = np.random.default_rng(2)
X = RNG.normal(size=(256, 4, 4, 1)).astype("float32")
Y = (X.reshape(256, -1)[:, :4].sum(axis=1) > 0).astype("int32")


def _model(activation="relu"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.RandomFlip("horizontal"),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation=activation),
            keras.layers.Dropout(0.3),
            keras.layers.GaussianNoise(0.2),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _dataset(x=X):
    return tf.data.Dataset.from_tensor_slices((x, Y)).batch(16)


def _weights(model):
    return [v.numpy() for v in model.variables]


@pytest.mark.parametrize("trainer", [False, "one_device", "mirrored"])
def test_fit_after_the_range_test_equals_fit_without_with_random_layers(trainer, mirrored):
    def target():
        model = _model()
        if trainer:
            strategy = mirrored if trainer == "mirrored" else tfaccel.devices.strategy(trainer)
            return tfaccel.Trainer(model, strategy=strategy, steps_per_loop=1)
        model.optimizer.build(model.trainable_variables)
        return model

    tested = target()
    tuning.find_learning_rate(tested, _dataset(), num_steps=12, max_lr=1.0)
    tested.fit(_dataset(), epochs=1, verbose=0)
    fresh = target()
    fresh.fit(_dataset(), epochs=1, verbose=0)
    model = tested.model if trainer else tested
    want = _weights(fresh.model if trainer else fresh)
    for got, expected in zip(_weights(model), want, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("trainer", [False, True])
def test_nan_inputs_partway_are_named_not_read_as_divergence(trainer):
    x = X.copy()
    x[10 * 16 + 3] = np.nan  # the 11th batch
    model = _model(activation="tanh")  # (XLA's relu turns NaN into 0)
    target = model
    if trainer:
        strategy = tfaccel.devices.strategy("one_device")
        target = tfaccel.Trainer(model, strategy=strategy, steps_per_loop=1)
    # the inputs themselves are checked as the test reads them (issue 69): no curve
    with pytest.raises(ValueError, match=r"batch 10 of the data .*non-finite feature"):
        tuning.find_learning_rate(target, _dataset(x), num_steps=16, max_lr=1e-2)


def test_a_climbing_loss_that_overflows_is_still_divergence():
    from tfaccel.tuning.lr import nonfinite

    assert nonfinite.cause([2.0, 1.9, 1.8, 1.7, 1.6, 1.7, 4.0, 30.0, float("nan")]) == "diverged"
    assert nonfinite.cause([2.0, 1.9, 1.8, 1.7, 1.6, 1.5, float("nan")]) == "non-finite input"
    assert nonfinite.cause([2.0, float("nan")]) == "diverged"  # too few points to tell
