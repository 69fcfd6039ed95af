"""Checkpoint/resume, preemption and divergence (training jobs run as processes of their own,
forked from one that imported TensorFlow once: forked.py)."""

import pathlib
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.train.state.checkpoint import CheckpointState

JOB = pathlib.Path(__file__).parent / "scripts" / "train_job.py"
EPOCHS, STEPS_PER_EPOCH, EXAMPLES = 3, 12, 96


def run_job(jobs, tmp, name, *extra, expect=0):
    cmd = [sys.executable, str(JOB), "--ckpt", str(tmp / name), "--out", str(tmp / f"{name}.npz")]
    result = jobs.run(cmd + list(extra), timeout=240)
    assert result.returncode == expect, result.stderr[-3000:]
    return result


def load(tmp, name):
    return dict(np.load(tmp / f"{name}.npz"))


def weights(result):
    return [result[k] for k in sorted(k for k in result if k.startswith("arr_"))]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, jobs):
    tmp = tmp_path_factory.mktemp("full")
    run_job(jobs, tmp, "full")
    return load(tmp, "full")


def assert_same_history(result, reference, epochs):
    """The resumed run logged `epochs` (the last ones) exactly as the uninterrupted one."""
    for key in ("loss_history", "accuracy_history"):
        assert len(result[key]) == epochs, result[key]
        np.testing.assert_allclose(result[key], reference[key][-epochs:], atol=1e-6)


def assert_same_training(result, reference):
    for got, want in zip(weights(result), weights(reference), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # Every example seen exactly once per epoch: no batch repeated or skipped.
    assert result["seen"] == EPOCHS * EXAMPLES
    assert result["id_sum"] == EPOCHS * EXAMPLES * (EXAMPLES - 1) / 2
    assert result["step"] == EPOCHS * STEPS_PER_EPOCH


def test_uninterrupted_run_learns(uninterrupted):
    assert uninterrupted["seen"] == EPOCHS * EXAMPLES
    assert uninterrupted["last_loss"] < uninterrupted["first_loss"]


def test_kill_9_mid_epoch_then_rerun_resumes_exactly(tmp_path, uninterrupted, jobs):
    killed = run_job(jobs, tmp_path, "job", "--kill-at", "18", expect=-signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert tf.train.latest_checkpoint(str(tmp_path / "job")).endswith("ckpt-16")
    run_job(jobs, tmp_path, "job", "--kill-at", "18")  # the same command again
    assert_same_training(load(tmp_path, "job"), uninterrupted)
    # The interrupted epoch's loss and accuracy include its steps before the kill.
    assert_same_history(load(tmp_path, "job"), uninterrupted, epochs=2)


def test_kill_9_after_a_save_on_the_epoch_boundary_logs_no_phantom_epoch(
    tmp_path, uninterrupted, jobs
):
    # checkpoint_every=4 lands on step 12, the last of epoch 0; killed at step 14.
    run_job(jobs, tmp_path, "job", "--kill-at", "14", expect=-signal.SIGKILL)
    assert tf.train.latest_checkpoint(str(tmp_path / "job")).endswith("ckpt-12")
    run_job(jobs, tmp_path, "job", "--kill-at", "14")
    result = load(tmp_path, "job")
    assert_same_training(result, uninterrupted)
    assert_same_history(result, uninterrupted, epochs=2)  # epochs 1 and 2; no empty epoch


def test_kill_9_mid_epoch_with_stateless_augmentation_resumes_bit_for_bit(tmp_path, jobs):
    run_job(jobs, tmp_path, "full", "--augment")
    run_job(jobs, tmp_path, "job", "--augment", "--kill-at", "18", expect=-signal.SIGKILL)
    run_job(jobs, tmp_path, "job", "--augment", "--kill-at", "18")
    result, reference = load(tmp_path, "job"), load(tmp_path, "full")
    assert_same_training(result, reference)
    assert_same_history(result, reference, epochs=2)


def test_kill_9_mid_epoch_on_one_device_with_augmentation_resumes_exactly(tmp_path, jobs):
    # OneDeviceStrategy's iterator cannot be saved: the resumed run skips ahead on its one
    # iterator (a second one of the same dataset would draw the next shuffle order).
    args = ("--augment", "--one-device")
    run_job(jobs, tmp_path, "full", *args)
    run_job(jobs, tmp_path, "job", *args, "--kill-at", "18", expect=-signal.SIGKILL)
    run_job(jobs, tmp_path, "job", *args, "--kill-at", "18")
    result, reference = load(tmp_path, "job"), load(tmp_path, "full")
    assert_same_training(result, reference)
    assert_same_history(result, reference, epochs=2)


def test_sigterm_saves_at_last_step_and_exits_cleanly(tmp_path, uninterrupted, jobs):
    run_job(jobs, tmp_path, "job", "--term-at", "10")  # exit status 0
    assert not (tmp_path / "job.npz").exists(), "fit must exit, not return, on preemption"
    assert tf.train.latest_checkpoint(str(tmp_path / "job")).endswith("ckpt-10")
    run_job(jobs, tmp_path, "job", "--term-at", "10")
    assert_same_training(load(tmp_path, "job"), uninterrupted)


# In-process checks.

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def opt():
    return keras.optimizers.SGD(0.1)


def make_trainer(units=8, strategy=None, optimizer=opt, **kwargs):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dense(2)]
        )

    return tfaccel.Trainer(
        build,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=strategy or tf.distribute.get_strategy(),
        steps_per_loop=1,
        **kwargs,
    )


def data(x=X):
    return tf.data.Dataset.from_tensor_slices((x, Y)).batch(8)


def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path):
    x = X.copy()
    x[40:] = np.nan  # steps 6, 7, 8 (of 8 per epoch) see NaN
    # Loss scaling skips the NaN steps, so the weights stay finite while the loss is not.
    trainer = make_trainer(optimizer=lambda: keras.optimizers.LossScaleOptimizer(opt()))
    with pytest.raises(tfaccel.TrainingDivergedError, match="3 consecutive step loops.*step 8"):
        trainer.fit(
            data(x),
            epochs=2,
            verbose=0,
            checkpoint_dir=tmp_path,
            checkpoint_every=1,
            divergence_loops=3,
            restore_on_divergence=True,
        )
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-5")
    assert int(trainer.step.numpy()) == 5  # restored
    assert all(np.isfinite(w).all() for w in trainer.model.get_weights())


def test_one_nan_cell_is_divergence_and_no_checkpoint_gets_nan_weights(tmp_path):
    x = X.copy()
    x[43, 2] = np.nan  # one cell, in step 6's batch
    trainer = make_trainer()
    with pytest.raises(tfaccel.TrainingDivergedError, match="after step 6") as caught:
        trainer.fit(data(x), epochs=2, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=1)
    assert caught.value.step == 6
    assert caught.value.variable == trainer.model.trainable_variables[0].path
    assert int(trainer.step.numpy()) == 6  # stopped in the loop that poisoned the weights
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest.endswith("ckpt-5")
    reader = tf.train.load_checkpoint(latest)
    floats = [k for k, d in reader.get_variable_to_dtype_map().items() if d.is_floating]
    assert len(floats) >= 4  # the two kernels and biases, at least
    assert all(np.isfinite(reader.get_tensor(k)).all() for k in floats)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    make_trainer(units=8).fit(data(), verbose=0, checkpoint_dir=tmp_path)
    with pytest.raises(tfaccel.CheckpointMismatchError, match="of another model"):
        make_trainer(units=5).fit(data(), verbose=0, checkpoint_dir=tmp_path)


@pytest.mark.parametrize("every", [0, -3, "step", 1.5])
def test_bad_checkpoint_every(tmp_path, every):
    with pytest.raises(ValueError, match="checkpoint_every"):
        make_trainer().fit(data(), verbose=0, checkpoint_dir=tmp_path, checkpoint_every=every)


def test_crash_during_save_leaves_previous_checkpoint(tmp_path):
    trainer = make_trainer()
    trainer.fit(data(), verbose=0, checkpoint_dir=tmp_path)  # ckpt-8
    # The synchronous write path (asynchronous writes: tests/test_async_checkpoint.py).
    objects = trainer.checkpoint_objects()
    state = CheckpointState(tmp_path, trainer.strategy, asynchronous=False, **objects)

    def crash(prefix, *args, **kwargs):
        pathlib.Path(f"{prefix}.index").write_bytes(b"half a checkpoint")
        raise OSError("disk vanished")

    state.checkpoint._write = crash
    with pytest.raises(OSError):
        state.save(99)
    state.close()  # gives the directory up (its lock), as fit does when it ends
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-8")
    fresh = make_trainer()
    with pytest.warns(UserWarning, match="ckpt-99 could not be read.*resumed from ckpt-8"):
        history = fresh.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    assert int(fresh.step.numpy()) == 16
    assert len(history.history["loss"]) == 1  # resumed after epoch 1


def test_finished_run_started_again_does_nothing(tmp_path):
    make_trainer().fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    again = make_trainer()
    history = again.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    assert int(again.step.numpy()) == 16
    assert history.history == {}


class StopAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.model.stop_training = True


@pytest.mark.parametrize("distributed", [False, True], ids=["iterator-saved", "mirrored-skip"])
def test_resume_mid_epoch_gives_the_same_weights(tmp_path, mirrored, distributed):
    strategy = mirrored if distributed else tf.distribute.get_strategy()

    def pipeline():
        source = tfaccel.data.from_arrays(X, Y)
        return tfaccel.data.pipeline(source, batch_size=8, training=True, seed=3, strategy=strategy)

    def fresh():
        return make_trainer(strategy=strategy)

    reference = fresh()
    expected = reference.fit(pipeline(), epochs=2, verbose=0).history
    first = fresh()
    first.fit(pipeline(), epochs=2, verbose=0, checkpoint_dir=tmp_path, callbacks=[StopAt(11)])
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-11")
    resumed = fresh()
    history = resumed.fit(pipeline(), epochs=2, verbose=0, checkpoint_dir=tmp_path).history
    assert int(resumed.step.numpy()) == 16
    # The loss tracker's state (3 steps of epoch 1) came back with the checkpoint.
    np.testing.assert_allclose(history["loss"], expected["loss"][1:], atol=1e-6)
    for got, want in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("stage", ["prefetch", "parallel-map"])
def test_resume_mid_epoch_of_a_reshuffled_prefetched_dataset_keeps_later_orders(tmp_path, stage):
    """The pattern users write, `shuffle(seed)` then `batch` then `prefetch` (or a parallel
    map): tf.data's buffered iterator checkpoint, saved mid-epoch, restored the shuffle's
    seeds two epochs ahead, so every later epoch's order differed; the Trainer saves the
    stream symbolically (positions, not buffers), and the resumed run equals the whole."""

    def reshuffled():
        # Epochs of 4 steps: the read-ahead reaches the next epoch (its shuffle's seeds).
        ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(64, seed=5).batch(16)
        if stage == "prefetch":
            return ds.prefetch(tf.data.AUTOTUNE)
        return ds.map(lambda x, y: (x * 2.0, y), num_parallel_calls=tf.data.AUTOTUNE)

    reference = make_trainer()
    reference.fit(reshuffled(), epochs=4, verbose=0)
    first = make_trainer()
    first.fit(reshuffled(), epochs=4, verbose=0, checkpoint_dir=tmp_path, callbacks=[StopAt(2)])
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")  # mid-epoch 0
    resumed = make_trainer()
    resumed.fit(reshuffled(), epochs=4, verbose=0, checkpoint_dir=tmp_path)
    assert int(resumed.step.numpy()) == 16
    for got, want in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
