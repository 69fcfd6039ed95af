"""The tfaccel callbacks work unchanged in tfaccel.Trainer.fit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import callbacks

X = np.random.default_rng(0).normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def build():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, activation="softmax")])


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_callbacks_in_trainer(distributed, mirrored):
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
        steps_per_loop=4,
    )
    throughput = callbacks.Throughput(warmup_steps=1, window=100, verbose=0)
    warmup = callbacks.LinearScalingWarmup(
        base_lr=0.01, base_batch_size=8, batch_size=16, warmup_epochs=1
    )
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)  # 6 steps per epoch
    history = trainer.fit(
        data,
        epochs=2,
        verbose=0,
        callbacks=callbacks.ordered(
            [throughput, warmup, callbacks.DeviceMemory(), callbacks.HostGap()]
        ),
    ).history
    for key in ("examples_per_sec", "steps_per_sec", "mem_host_rss_mb", "host_gap_fraction"):
        assert key in history, key
    assert throughput.summary["total_steps"] == 12
    assert throughput.summary["total_examples"] == 12 * 16
    # Warm-up ends after one epoch (6 steps) at 0.01 * 16 / 8.
    assert float(trainer.optimizer.learning_rate.numpy()) == pytest.approx(0.02)
    assert warmup.lr_at(3) == pytest.approx(0.01 + 0.01 * 3 / 6)
