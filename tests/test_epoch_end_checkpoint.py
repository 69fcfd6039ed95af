"""The epoch's checkpoint holds what its callbacks' `on_epoch_end` changed (issue 68's
follow-up): a rate lowered at an epoch's end — the user's `ReduceLROnPlateau` composing
with `OneCycle`, `Plateau`'s own decay — survives a kill -9 right after that epoch, so the
resumed run ends with the uninterrupted run's weights and factor."""

import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_trainer_progressive_batch import killed_and_resumed

import tfaccel
from tfaccel.methods.adaptive.plateau import Plateau

JOB = """
import os, signal, sys, time
import keras
import numpy as np
import tensorflow as tf
import tfaccel
from tfaccel import methods
from tfaccel.methods.adaptive.plateau import Plateau

directory, kill_at, out, which = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 6)).astype("float32")
y = rng.integers(0, 3, size=32).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 4 steps an epoch


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


class Kill(keras.callbacks.Callback):
    # At the first step after the epoch's end, once its checkpoint is written.
    def on_train_begin(self, logs=None):
        print("started at step", trainer.runner.position.step, flush=True)

    def on_train_batch_begin(self, batch, logs=None):
        if kill_at and trainer.runner.position.step == kill_at:
            index = os.path.join(directory, f"ckpt-{kill_at}.index")
            for _ in range(600):  # an asynchronous write: wait for its index
                if os.path.exists(index):
                    break
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGKILL)


if which == "reduce":  # halves at epoch 2's end (the loss never improves by 1e9), not after
    chosen = [methods.OneCycle(peak=0.05)]
    callbacks = [keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9, cooldown=2)]
else:  # halves at every epoch's end from the second: patience 1, no loss is better by 1e9
    chosen = [Plateau(peak=0.05, patience=1, min_delta=1e9, warmup_steps=2)]
    callbacks = []
trainer = tfaccel.Trainer(build, optimizer=keras.optimizers.SGD(0.1),
                          loss="sparse_categorical_crossentropy", steps_per_loop=1,
                          jit_compile=False, methods=chosen)
trainer.fit(data, epochs=3, callbacks=[*callbacks, Kill()], checkpoint_dir=directory or None,
            verbose=0)
schedule = trainer.methods.plan.methods[0].schedule
factor = schedule.callback_factor if which == "reduce" else schedule.factor
np.save(out, np.concatenate([*(w.ravel() for w in trainer.model.get_weights()),
                             [float(factor.numpy())]]))
"""


@pytest.mark.parametrize("which", ["reduce", "plateau"])
def test_a_rate_lowered_at_an_epochs_end_survives_a_kill_right_after_it(which, tmp_path, jobs):
    """Epoch 2 (steps 4-7) ends with the rate halved; killed at step 8, resumed from the
    checkpoint of epoch 2's end: the weights and factor of the run never killed
    (ReduceLROnPlateau: 0.5, its cooldown holding epoch 3; Plateau: 0.25)."""
    want, got, out = killed_and_resumed(jobs, tmp_path, JOB, 8, which)
    assert "started at step 8" in out  # the epoch-2 checkpoint, not epoch 1's
    assert want[-1] == (0.5 if which == "reduce" else 0.25)
    assert got[-1] == want[-1]
    assert float(np.max(np.abs(want - got))) < 1e-6


def test_a_preemption_at_an_epochs_end_saves_its_callbacks_changes(tmp_path):
    """SIGTERM on epoch 2's last step: the run stops once the epoch is finished, and its
    checkpoint (step 8) holds the factor Plateau halved at that end; the resumed run
    starts from it and ends as the run never stopped (factor 0.25)."""
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(32, 6)).astype("float32"), rng.integers(0, 3, size=32))
    ).batch(8)

    def build():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])

    def trainer():
        chosen = [Plateau(peak=0.05, patience=1, min_delta=1e9, warmup_steps=2)]
        return tfaccel.Trainer(
            build,
            optimizer=keras.optimizers.SGD(0.1),
            loss="sparse_categorical_crossentropy",
            steps_per_loop=1,
            jit_compile=False,
            methods=chosen,
        )

    def factor(ours):
        return float(ours.methods.plan.methods[0].schedule.factor.numpy())

    class Signal(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stopped.runner.position.step == 8:
                signal.raise_signal(signal.SIGTERM)

    class Restored(keras.callbacks.Callback):
        seen = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.seen is None:  # the resumed run's first step
                self.seen = factor(resumed)

    def fit(ours, callbacks=(), directory=None):
        ours.fit(data, epochs=3, callbacks=list(callbacks), checkpoint_dir=directory,
                 exit_on_preemption=False, verbose=0)  # fmt: skip
        return ours

    whole = fit(trainer())
    stopped = trainer()
    fit(stopped, [Signal()], tmp_path)
    assert stopped.preempted and int(stopped.step) == 8
    resumed, restored = trainer(), Restored()
    fit(resumed, [restored], tmp_path)
    assert restored.seen == 0.5  # halved at epoch 2's end, before its save
    assert factor(whole) == factor(resumed) == 0.25
    got, want = resumed.model.get_weights(), whole.model.get_weights()
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, want, strict=True)) < 1e-6
