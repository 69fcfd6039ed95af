"""steps_per_loop="auto" honours callbacks that need one batch hook per step (issue 41, Must 4)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import callbacks as cb
from tfaccel import tuning
from tfaccel.choices.loop_size import LoopSizer, needs_batches


class PerBatchRate(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        pass


class OldStyle(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        pass


class EpochOnly(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class LoopAware(PerBatchRate):
    loop_batches_ok = True


def _ramp():
    control = type("Control", (), {"set": lambda self, rate: None})()
    return tuning.LRRangeTest(control, 1e-5, 1.0, 20)


@pytest.mark.parametrize(
    "callback",
    [
        PerBatchRate(),
        OldStyle(),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None),
        keras.callbacks.ModelCheckpoint("/tmp/unused.keras", save_freq=5),
        keras.callbacks.TensorBoard("/tmp/unused", update_freq="batch"),
    ],
)
def test_batch_hooks_need_batches(callback):
    assert needs_batches(callback)


@pytest.mark.parametrize(
    "callback",
    [
        EpochOnly(),
        LoopAware(),
        keras.callbacks.History(),
        keras.callbacks.ProgbarLogger(),
        keras.callbacks.EarlyStopping(),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None),
        keras.callbacks.ModelCheckpoint("/tmp/unused.keras"),
        keras.callbacks.TensorBoard("/tmp/unused"),
        cb.Throughput(),
        cb.Bottleneck(),
        cb.HostGap(),
        cb.DeviceMemory(),
        cb.LinearScalingWarmup(0.1, 32, 64),
        cb.ProfileSteps("/tmp/unused", 2, 4),
    ],
)
def test_loop_level_callbacks_keep_the_loop(callback):
    assert not needs_batches(callback)


def test_auto_is_capped_at_one_step_and_says_so():
    sizer = LoopSizer("auto")
    text = sizer.honour_callbacks([EpochOnly(), _ramp(), PerBatchRate(), PerBatchRate()])
    assert text == "1 (per-batch callbacks: LRRangeTest, PerBatchRate)"
    assert sizer.next() == 1 and not sizer.measuring
    assert sizer.describe(100) == text
    for _ in range(20):  # nothing is learnt from the capped calls
        assert sizer.record(1, 1, 0.01) is False
    assert sizer.chosen is None
    assert sizer.honour_callbacks(keras.callbacks.CallbackList([EpochOnly()])) is None
    assert sizer.measuring and sizer.next() == 1  # the measurement starts at its warm-up


def test_a_chosen_n_is_capped_then_restored():
    sizer = LoopSizer("auto")
    sizer.chosen = 40
    assert sizer.honour_callbacks([PerBatchRate()]) is not None
    assert sizer.next() == 1
    assert sizer.honour_callbacks([]) is None
    assert sizer.next() == 40


def test_a_fixed_steps_per_loop_is_the_users_choice():
    sizer = LoopSizer(8)
    assert sizer.honour_callbacks([PerBatchRate()]) is None
    assert sizer.next() == 8


class StopAt(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(batch)
        if batch + 1 == self.at:
            self.model.stop_training = True


def test_stop_training_takes_effect_within_one_step_at_one_step_per_loop():
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfaccel.Trainer(model, steps_per_loop=1)
    stop = StopAt(5)
    trainer.fit(data, epochs=3, callbacks=[stop], verbose=0)
    assert stop.seen == [0, 1, 2, 3, 4]
    assert int(trainer.step.numpy()) == 5


def test_auto_stops_within_one_step_and_says_why_in_the_settings():
    x = np.random.default_rng(0).normal(size=(2048, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfaccel.Trainer(model)  # steps_per_loop="auto"
    stop = StopAt(7)
    trainer.fit(data, epochs=1, callbacks=[stop, cb.Throughput(verbose=0)], verbose=0)
    assert stop.seen == list(range(7)) and int(trainer.step.numpy()) == 7
    assert trainer.settings["steps_per_loop"] == "1 (per-batch callbacks: StopAt)"


def test_the_range_test_gets_one_point_per_step_under_auto():
    x = np.random.default_rng(0).normal(size=(1024, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report = tuning.find_learning_rate(tfaccel.Trainer(model), data, num_steps=30)
    assert len(report.losses) == report.steps
