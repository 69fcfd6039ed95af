"""Asynchronous checkpoints: kill -9 during background writes, the waits, the errors."""

import functools
import json
import os
import pathlib
import re
import sys
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.train import trainer as trainer_module
from tfaccel.train.state import async_save
from tfaccel.train.state import checkpoint_files as files
from tfaccel.train.state.checkpoint import CheckpointState
from tfaccel.train.state.policies import Checkpointing

SCRIPTS = pathlib.Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import async_save_job  # noqa: E402

JOB = SCRIPTS / "async_save_job.py"
TRIALS = 20


def run(jobs, *args, timeout=180):
    """The job in a process of its own, forked from one that imported TensorFlow (conftest)."""
    return jobs.run([sys.executable, str(JOB), *map(str, args)], timeout=timeout)


def test_sigkill_during_background_writes_always_leaves_an_exact_checkpoint(tmp_path, jobs):
    result = run(jobs, "kill", tmp_path, TRIALS, 40)
    assert result.returncode == 0, result.stderr[-3000:]
    delays = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(delays) == TRIALS
    in_flight = 0
    for trial in range(TRIALS):
        directory = tmp_path / f"trial-{trial}"
        in_flight += any(re.match(r"ckpt-\d+_temp", p.name) for p in directory.iterdir())
        objects = async_save_job.saved_objects()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = CheckpointState(directory, tf.distribute.get_strategy(), keep=2, **objects)
            try:
                path = state.restore()
            finally:
                state.close()
        assert path is not None, f"trial {trial}: no checkpoint found"
        messages = [str(w.message) for w in caught if "Took over the lock" not in str(w.message)]
        assert not messages, f"trial {trial}: {messages}"  # no checkpoint set aside, no repair
        assert files.unreadable(path) is None  # every checksum and length verified
        step = int(path.rsplit("-", 1)[1])
        assert int(objects["step"].numpy()) == step, trial
        for variable in objects["big"]:
            assert np.all(variable.numpy() == step), trial
        assert int(next(objects["iterator"]).numpy()) == step, trial  # the input position
        assert not (directory / files.CORRUPT).exists()
        assert not [p for p in directory.iterdir() if "_temp" in p.name]  # cleaned at start
    assert in_flight >= TRIALS // 4, f"only {in_flight} kills hit a write in flight"


# In-process checks.

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def make_trainer(jit_compile="auto"):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(2)])

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
        jit_compile=jit_compile,
    )


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)  # 8 steps per epoch


@pytest.fixture
def slow_writes(monkeypatch):
    """Every background write takes 0.3 s more; records which steps were written."""
    written, write = [], async_save.write

    def slow(held, prefix):
        time.sleep(0.3)
        written.append(int(prefix.rsplit("-", 1)[1]))
        return write(held, prefix)

    monkeypatch.setattr(async_save, "write", slow)
    return written


def test_the_end_of_fit_waits_for_the_save_in_flight(tmp_path, slow_writes):
    trainer = make_trainer()
    trainer.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=4)
    assert slow_writes == [4, 8, 12, 16]  # written in the background, each one
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-16")  # published
    assert files.unreadable(str(tmp_path / "ckpt-16")) is None
    assert not (tmp_path / "tfaccel.lock").exists()  # released after the write
    reference = make_trainer()
    reference.fit(data(), epochs=2, verbose=0)
    resumed = make_trainer()
    resumed.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)  # nothing left to do
    for got, want in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_an_exception_in_fit_completes_the_save_in_flight(tmp_path, slow_writes):
    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 5:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_trainer().fit(
            data(),
            epochs=2,
            verbose=0,
            checkpoint_dir=tmp_path,
            checkpoint_every=4,
            callbacks=[Fail()],
        )
    assert slow_writes == [4]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-4")
    assert files.unreadable(str(tmp_path / "ckpt-4")) is None
    assert not [p for p in tmp_path.iterdir() if "_temp" in p.name]
    assert not (tmp_path / "tfaccel.lock").exists()


def test_a_failed_background_write_is_raised_by_the_next_save(tmp_path, monkeypatch):
    def fail(held, prefix):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(async_save, "write", fail)
    with pytest.raises(OSError, match=r"Cannot save checkpoint 4 .*No space left"):
        make_trainer().fit(data(), epochs=1, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=4)
    assert not (tmp_path / "tfaccel.lock").exists()


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager-steps", "xla-steps"])
def test_background_writes_hold_the_state_of_their_step_while_training_goes_on(
    tmp_path, slow_writes, monkeypatch, jit_compile
):
    # Each write takes 0.3 s while the steps go on: a checkpoint must still hold its own
    # step's state, tensor for tensor the one a synchronous save writes.
    make_trainer(jit_compile).fit(
        data(), epochs=2, verbose=0, checkpoint_dir=tmp_path / "a", keep=9, checkpoint_every=2
    )
    assert slow_writes == [2, 4, 6, 8, 10, 12, 14, 16]
    synchronous = functools.partial(Checkpointing, asynchronous=False)
    monkeypatch.setattr(trainer_module, "Checkpointing", synchronous)
    make_trainer(jit_compile).fit(
        data(), epochs=2, verbose=0, checkpoint_dir=tmp_path / "s", keep=9, checkpoint_every=2
    )
    assert slow_writes == [2, 4, 6, 8, 10, 12, 14, 16]  # no background write this time
    for step in slow_writes:
        fast, slow = (tf.train.load_checkpoint(str(tmp_path / f"{d}/ckpt-{step}")) for d in "as")
        keys = fast.get_variable_to_dtype_map()
        assert keys == slow.get_variable_to_dtype_map()
        for key, dtype in keys.items():
            if dtype.is_floating:
                np.testing.assert_allclose(fast.get_tensor(key), slow.get_tensor(key), atol=1e-7)
            elif dtype != tf.variant and key != "_CHECKPOINTABLE_OBJECT_GRAPH":  # Keras names
                np.testing.assert_array_equal(fast.get_tensor(key), slow.get_tensor(key), key)


def test_synchronous_saves_stay_available_and_equal(tmp_path):
    trainer = make_trainer()
    trainer.fit(data(), epochs=1, verbose=0)
    objects = trainer.checkpoint_objects()
    for asynchronous in (True, False):
        state = CheckpointState(
            tmp_path / str(asynchronous), trainer.strategy, asynchronous=asynchronous, **objects
        )
        assert state.asynchronous is asynchronous
        state.save(8)
        state.close()
    fast, slow = (tf.train.load_checkpoint(str(tmp_path / f"{a}/ckpt-8")) for a in (True, False))
    keys = fast.get_variable_to_shape_map()
    assert keys == slow.get_variable_to_shape_map()
    for key in keys:
        np.testing.assert_array_equal(fast.get_tensor(key), slow.get_tensor(key))


def test_checkpointing_validates_asynchronous():
    assert Checkpointing("d").asynchronous is True
    assert Checkpointing("d", asynchronous=False).asynchronous is False
    with pytest.raises(ValueError, match="asynchronous must be True or False"):
        Checkpointing("d", asynchronous="yes")


def test_sigterm_during_a_background_write_completes_it_and_exits_0(tmp_path, jobs):
    # The documented preemption status (docs/how-to/resume.md): 0 once a checkpoint holds it.
    result = run(jobs, "term", tmp_path / "job")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit returned" not in result.stdout
    assert "SIGTERM" in result.stderr and "run the same command to resume" in result.stderr
    latest = tf.train.latest_checkpoint(str(tmp_path / "job"))
    assert latest.endswith("ckpt-6"), latest  # the save of the last step, published
    assert files.unreadable(latest) is None
    assert not [p for p in (tmp_path / "job").iterdir() if "_temp" in p.name]
    assert not os.path.exists(tmp_path / "job" / "tfaccel.lock")


@pytest.mark.parametrize("left", ["data-only", "data-and-index"])
def test_the_files_of_a_save_killed_before_its_temp_folder_went_are_not_a_checkpoint(
    tmp_path, left
):
    # TensorFlow deletes ckpt-N_temp/ after the index: files beside it are unfinished.
    strategy = tf.distribute.get_strategy()
    for step in (4, 8):
        objects = async_save_job.saved_objects()
        objects["step"].assign(step)
        state = CheckpointState(tmp_path, strategy, keep=3, **objects)
        state.save(step)
        state.close()
    (tmp_path / "ckpt-8_temp").mkdir()
    files.write_state(str(tmp_path), [4])  # ckpt-8 was never published
    if left == "data-only":
        (tmp_path / "ckpt-8.index").unlink()
    else:  # e.g. an index cut short: it is not read, it is removed
        index = tmp_path / "ckpt-8.index"
        index.write_bytes(index.read_bytes()[:20])
    objects = async_save_job.saved_objects()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = CheckpointState(tmp_path, strategy, keep=3, **objects)
        try:
            assert state.restore().endswith("ckpt-4")
        finally:
            state.close()
    assert int(objects["step"].numpy()) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-8")]


def test_a_directory_replaced_by_a_file_during_a_background_write_is_named(tmp_path, slow_writes):
    folder = tmp_path / "ckpt"

    class ReplaceByFile(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and folder.is_dir():  # checkpoint 1 is still being written
                import shutil

                shutil.rmtree(folder)
                folder.write_text("not a folder any more")

    with pytest.raises(NotADirectoryError, match="is a file now.*Move that file away"):
        make_trainer().fit(
            data(), verbose=0, callbacks=[ReplaceByFile()], checkpoint_dir=str(folder),
            checkpoint_every=1,
        )  # fmt: skip
