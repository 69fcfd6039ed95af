"""One strategy per set of devices: a hand-written loop and the Trainer share it, or are told.

TensorFlow's collective all-reduce keys are process-wide: once one collective strategy
over /cpu:0 and /cpu:1 has run steps, another over them would fail. So this module runs
steps on one collective strategy only (`shared`), kept for the process like any that
`tfaccel.devices.strategy` makes.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CPUS

import tfaccel
from tfaccel import devices, shared_strategy

GLOBAL_BATCH = 32


@pytest.fixture(scope="module")
def shared():
    """TensorFlow's own cross-device choice on CPUs (collective all-reduce), via tfaccel."""
    strategy = tfaccel.devices.strategy("mirrored", devices=CPUS, cross_device_ops=None)
    assert shared_strategy.uses_collectives(strategy)
    return strategy


@pytest.fixture
def isolated(monkeypatch):
    """The strategies this test makes are forgotten afterwards (none runs a collective)."""
    monkeypatch.setattr(shared_strategy, "_made", {})
    monkeypatch.setattr(shared_strategy, "_known", list(shared_strategy._known))


def arrays(n=256, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")
    return x, y


def hand_written_loop(strategy, x, y):
    """The TensorFlow tutorial's custom loop, as a user writes it; returns `epoch() -> loss`."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(5), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    )

    @tf.function
    def train_step(batch):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = loss_fn(yb, model(xb, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    def epoch():
        return float(np.mean([float(train_step(batch)) for batch in dist]))

    return epoch


def build_wide():  # other variable shapes than the hand-written loop's model
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(50), keras.layers.Dense(3)])


def test_the_same_request_returns_the_same_strategy(isolated):
    first = devices.strategy("mirrored", devices=CPUS)
    assert devices.strategy("mirrored", devices=CPUS) is first
    assert devices.strategy("auto", devices=CPUS) is first  # auto resolves to the same
    one = devices.strategy("one_device", devices=["/cpu:1"])
    assert devices.strategy("one_device", devices=["/cpu:1"]) is one
    # Other devices, or another cross_device_ops object: a new strategy.
    assert devices.strategy("mirrored", devices=CPUS[::-1]) is not first
    assert devices.strategy("one_device", devices=["/cpu:0"]) is not one
    other_ops = tf.distribute.ReductionToOneDevice()
    assert devices.strategy("mirrored", devices=CPUS, cross_device_ops=other_ops) is not first


def test_a_trainer_and_a_hand_written_loop_alternate_on_one_strategy(shared):
    x, y = arrays()
    strategy = tfaccel.devices.strategy("mirrored", devices=CPUS, cross_device_ops=None)
    assert strategy is shared
    epoch = hand_written_loop(strategy, x, y)
    trainer = tfaccel.Trainer(  # as the user wrote it: asks for the strategy again
        build_wide,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tfaccel.devices.strategy("mirrored", devices=CPUS, cross_device_ops=None),
    )
    assert trainer.strategy is strategy
    data = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(x, y),
        batch_size=GLOBAL_BATCH,
        training=True,
        seed=0,
        strategy=strategy,
    )
    losses, fitted = [], []
    for _ in range(3):  # alternating, as a user porting one loop at a time
        losses.append(epoch())
        fitted += trainer.fit(data, epochs=len(fitted) + 1, verbose=0).history["loss"]
    assert losses[-1] < losses[0] and fitted[-1] < fitted[0]


def test_a_second_collective_strategy_over_the_same_devices_is_refused(shared):
    mine = tf.distribute.MirroredStrategy(CPUS)  # a hand-written loop's own, as in the tutorial
    with pytest.raises(ValueError, match=r"second MirroredStrategy over \[.*CPU:0.*CPU:1") as info:
        tfaccel.Trainer(build_wide, loss="mse", strategy=mine)
    text = str(info.value)
    assert hex(id(shared)) in text and "pass strategy=" in text
    assert "test_shared_strategy.py" in text  # where the first one was made


def test_strategies_without_collectives_are_never_refused(shared, mirrored):
    # tfaccel's CPU mirrored strategy reduces to one device: no collective keys to share.
    other = tf.distribute.MirroredStrategy(
        CPUS, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    assert tfaccel.Trainer(build_wide, loss="mse", strategy=mirrored).strategy is mirrored
    assert tfaccel.Trainer(build_wide, loss="mse", strategy=other).strategy is other
