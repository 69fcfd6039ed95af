"""On resume the user's optimizer settings and new metrics win; a true mismatch is named."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel

X = np.random.default_rng(2).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)  # 8 steps per epoch


def fit(directory, epochs, optimizer, metrics=(), units=2, **kwargs):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dense(2)]
        )

    trainer = tfaccel.Trainer(
        build,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
    )
    history = trainer.fit(data(), epochs=epochs, verbose=0, checkpoint_dir=directory, **kwargs)
    return trainer, history.history


def test_a_new_learning_rate_is_used_and_named(tmp_path, caplog):
    first, _ = fit(tmp_path, 1, lambda: keras.optimizers.Adam(1e-2))
    before = first.model.get_weights()
    with caplog.at_level(logging.INFO, logger="tfaccel"):
        trainer, _ = fit(tmp_path, 2, lambda: keras.optimizers.Adam(1e-5, beta_1=0.8))
    assert float(trainer.optimizer.learning_rate.numpy()) == pytest.approx(1e-5)
    assert int(trainer.optimizer.iterations.numpy()) == 16  # the state was restored
    # Eight Adam steps of at most ~1e-5 each: the epoch trained with the new rate (0.01: ~0.08).
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(before, trainer.model.get_weights(), strict=True)
    )
    assert 0 < moved < 2e-4
    changed = (
        "beta_1: 0.9 in the checkpoint → 0.8 now; learning_rate: 0.01 in the checkpoint → 1e-05 now"
    )
    assert changed in caplog.text
    assert trainer.settings["changed since the checkpoint"] == changed


def test_a_learning_rate_schedule_replaces_a_saved_constant_and_back(tmp_path, caplog):
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, decay_steps=4, decay_rate=0.5)
    fit(tmp_path, 1, lambda: keras.optimizers.SGD(0.1))
    with caplog.at_level(logging.INFO, logger="tfaccel"):
        trainer, _ = fit(tmp_path, 2, lambda: keras.optimizers.SGD(schedule))
    assert float(trainer.optimizer.learning_rate) == pytest.approx(1e-3 * 0.5 ** (16 / 4))
    assert "learning_rate: 0.1 in the checkpoint → {" in caplog.text
    trainer, _ = fit(tmp_path, 3, lambda: keras.optimizers.SGD(0.05))
    assert float(trainer.optimizer.learning_rate.numpy()) == pytest.approx(0.05)


def test_a_metric_new_to_the_checkpoint_starts_from_zero(tmp_path, caplog):
    sgd = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    fit(tmp_path, 1, sgd, checkpoint_every=3)  # ckpt-3, ckpt-6, ckpt-8
    for path in [*tmp_path.glob("ckpt-8.*"), tmp_path / "checkpoint"]:
        path.unlink()  # resume mid-epoch, from ckpt-6
    with caplog.at_level(logging.INFO, logger="tfaccel"), pytest.warns(match="state file"):
        trainer, history = fit(tmp_path, 2, sgd, metrics=["accuracy"])
    assert "Metric(s) accuracy are new to the checkpoint" in caplog.text
    assert len(history["accuracy"]) == 2 and 0 <= history["accuracy"][0] <= 1
    assert int(trainer.step.numpy()) == 16


def test_another_model_is_a_mismatch_that_names_the_shapes(tmp_path):
    sgd = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    fit(tmp_path, 1, sgd, units=8)
    with pytest.raises(tfaccel.CheckpointMismatchError, match=r"names or shapes differ") as caught:
        fit(tmp_path, 2, sgd, units=5)
    assert "(4, 8)" in str(caught.value) and "(4, 5)" in str(caught.value)
    assert not (tmp_path / "corrupt").exists()


def test_an_optimizer_without_a_config_still_resumes(tmp_path):
    class Custom(keras.optimizers.SGD):
        def get_config(self):
            raise NotImplementedError

    fit(tmp_path, 1, lambda: Custom(0.1))
    trainer, _ = fit(tmp_path, 2, lambda: Custom(0.1))
    assert int(trainer.step.numpy()) == 16
