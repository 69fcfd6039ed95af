"""Issue 37, part A: signals and exit status, compiled-model settings, resume."""

import pathlib
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel

JOB = pathlib.Path(__file__).parent / "scripts" / "train_job.py"


def run_job(tmp, *extra):
    cmd = [sys.executable, str(JOB), "--ckpt", str(tmp / "ckpt"), "--out", str(tmp / "out.npz")]
    return subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=240)


# -- signals and exit status ----------------------------------------------------------------


def test_sigterm_without_checkpoint_dir_exits_143_and_says_nothing_was_saved(tmp_path):
    result = run_job(tmp_path, "--no-ckpt", "--term-at", "6")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "SIGTERM" in result.stderr and "nothing was saved" in result.stderr
    assert not (tmp_path / "out.npz").exists()  # the code after fit did not run


def test_ctrl_c_without_checkpoint_dir_raises_keyboard_interrupt(tmp_path):
    result = run_job(tmp_path, "--no-ckpt", "--int-at", "6")
    assert result.returncode in (-signal.SIGINT, 128 + signal.SIGINT), result.stderr[-2000:]
    assert "KeyboardInterrupt" in result.stderr and "nothing was saved" in result.stderr
    assert not (tmp_path / "out.npz").exists()


def test_sigterm_with_a_checkpoint_exits_0_and_names_it(tmp_path):
    result = run_job(tmp_path, "--term-at", "10")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "saved the checkpoint" in result.stderr and "ckpt-10" in result.stderr
    assert "run the same command to resume" in result.stderr


class Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch >= 3:
            import os

            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_copies_the_trained_weights_back_to_a_compiled_model(mirrored):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    initial = model.get_weights()
    trainer = tfaccel.Trainer(model, strategy=mirrored, steps_per_loop=2)
    assert trainer.model is not model  # a copy made in the strategy's scope
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(x, x[:, :2], batch_size=8, epochs=5, callbacks=[Interrupt()], verbose=0)
    assert trainer.preempted and 0 < int(trainer.step.numpy()) < 40
    for got, want, before in zip(
        model.get_weights(), trainer.model.get_weights(), initial, strict=True
    ):
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, before)
    assert tf.reduce_all(tf.math.is_finite(model.weights[0])).numpy()
