"""The doctor with methods on: before the first fit (the plan is not made yet; the doctor's
probe builds the optimizer and restores it) and after it (the doctor reads the training
data through the plan's batch maps, as fit does)."""

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import methods

RNG = np.random.default_rng(0)
X = RNG.normal(size=(256, 6, 6, 1)).astype("float32")
Y = RNG.integers(0, 4, 256).astype("int32")


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(256, seed=0).batch(32)


def build():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(4, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )


def trainer():
    return tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.Adam(),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        methods=[methods.OneCycle(), methods.MixUp(0.2), methods.EMA(0.8)],
        steps_per_loop=2,
        jit_compile=False,
    )


def test_the_doctor_before_and_after_the_first_fit_with_methods_on():
    job = trainer()
    before = tfaccel.doctor.diagnose(job, data(), budget_s=2)
    assert before.verdict
    history = job.fit(data(), epochs=1, verbose=0)  # the probed optimizer is rebuilt
    assert np.isfinite(history.history["loss"][0])
    assert [m.name for m in job.methods.plan.methods] == ["one-cycle", "ema", "mixup"]
    assert int(job.runner.optimizer.iterations) == 8
    fed = job.feed(data())  # what the doctor reads: mixed one-hot labels, as fit trains on
    assert tuple(fed.dataset.element_spec[1].shape) == (None, 4)
    after = tfaccel.doctor.diagnose(job, data(), budget_s=2)
    assert after.verdict


def test_an_optimizer_that_took_steps_is_still_refused():
    model = build()
    model.compile(keras.optimizers.Adam(), "sparse_categorical_crossentropy")
    model.fit(data(), epochs=1, verbose=0)
    try:
        methods.for_fit(
            [methods.OneCycle()], model, data(), epochs=2, loss="mse", optimizer=model.optimizer
        )
    except ValueError as error:
        assert "fresh optimizer" in str(error)
    else:
        raise AssertionError("a stepped optimizer was rebuilt")
