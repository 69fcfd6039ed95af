"""Issue 37, part A: signals and exit status, compiled-model settings, resume."""

import os
import pathlib
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel

JOB = pathlib.Path(__file__).parent / "scripts" / "train_job.py"


def run_job(jobs, tmp, *extra):
    cmd = [sys.executable, str(JOB), "--ckpt", str(tmp / "ckpt"), "--out", str(tmp / "out.npz")]
    return jobs.run(cmd + list(extra), timeout=240)


# -- signals and exit status ----------------------------------------------------------------


def test_sigterm_without_checkpoint_dir_exits_143_and_says_nothing_was_saved(tmp_path, jobs):
    result = run_job(jobs, tmp_path, "--no-ckpt", "--term-at", "6")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "SIGTERM" in result.stderr and "nothing was saved" in result.stderr
    assert not (tmp_path / "out.npz").exists()  # the code after fit did not run


def test_ctrl_c_without_checkpoint_dir_raises_keyboard_interrupt(tmp_path, jobs):
    result = run_job(jobs, tmp_path, "--no-ckpt", "--int-at", "6")
    assert result.returncode in (-signal.SIGINT, 128 + signal.SIGINT), result.stderr[-2000:]
    assert "KeyboardInterrupt" in result.stderr and "nothing was saved" in result.stderr
    assert not (tmp_path / "out.npz").exists()


def test_sigterm_with_a_checkpoint_exits_0_and_names_it(tmp_path, jobs):
    result = run_job(jobs, tmp_path, "--term-at", "10")
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


# -- compiled-model settings ----------------------------------------------------------------

X = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
Y = (X @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]


def linear(name="out"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="features")
    return keras.Model(inputs, keras.layers.Dense(1, name=name)(inputs))


def test_a_sum_reduction_trains_as_model_fit_does(mirrored):
    reference = linear()
    reference.compile(
        optimizer=keras.optimizers.SGD(0.001), loss=keras.losses.MeanSquaredError(reduction="sum")
    )
    history = reference.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    trainer = tfaccel.Trainer(
        linear,
        optimizer=lambda: keras.optimizers.SGD(0.001),
        loss=keras.losses.MeanSquaredError(reduction="sum"),
        strategy=mirrored,
        steps_per_loop=2,
    )
    ours = trainer.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(trainer.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.history["loss"], history.history["loss"], rtol=1e-4)


def test_a_reduction_the_trainer_cannot_do_is_refused():
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    with pytest.raises(ValueError, match="reduction='mean_with_sample_weight'.*'sum'"):
        tfaccel.Trainer(linear, loss=loss)


def test_run_eagerly_is_refused_with_the_reason():
    model = linear()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    with pytest.raises(ValueError, match="run_eagerly=True.*tf.function"):
        tfaccel.Trainer(model)


def test_an_optimizer_that_trained_outside_the_scope_continues_from_its_state(mirrored):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.5)
    model = linear()
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9), loss="mse")
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)  # 4 steps
    trainer = tfaccel.Trainer(model, strategy=mirrored, steps_per_loop=1)
    assert trainer.optimizer is not model.optimizer  # made in the strategy's scope
    assert int(trainer.optimizer.iterations.numpy()) == 4
    for got, want in zip(trainer.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # One more epoch continues exactly as model.fit would (the schedule at step 4 on).
    reference = linear()
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9), loss="mse")
    reference.optimizer.build(reference.trainable_variables)
    for target, source in zip(
        reference.optimizer.variables, model.optimizer.variables, strict=True
    ):
        target.assign(source)
    reference.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    trainer.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_optimizer_whose_state_does_not_fit_is_restarted_loudly(mirrored):
    other = linear()
    other.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    other.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=other.optimizer, loss="mse")  # slots of another model
    with pytest.warns(UserWarning, match="has trained 4 steps.*restart from 0"):
        trainer = tfaccel.Trainer(model, strategy=mirrored)
    assert int(trainer.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("key", [0.6, "zero", True])
def test_class_weight_keys_must_be_class_indices(key):
    trainer = tfaccel.Trainer(linear, loss="mse")
    with pytest.raises(ValueError, match="class_weight keys must be class indices"):
        trainer.fit(X, (Y > 0).astype("int32"), class_weight={key: 2.0}, epochs=1, verbose=0)


def test_a_one_entry_loss_dict_is_accepted_as_model_fit_does():
    trainer = tfaccel.Trainer(linear, loss={"out": "mse"}, steps_per_loop=1)
    trainer.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    assert int(trainer.step.numpy()) == 4


@pytest.mark.parametrize("loss", [["mse", "mae"], {"out": "mse", "other": "mae"}, {"typo": "mse"}])
def test_losses_for_several_outputs_say_the_trainer_trains_single_output_models(loss):
    with pytest.raises(ValueError, match="The Trainer trains single-output models"):
        tfaccel.Trainer(linear, loss=loss)


def test_sample_weights_one_row_short_are_named():
    trainer = tfaccel.Trainer(linear, loss="mse")
    with pytest.raises(ValueError, match="sample_weight has 31 rows but x has 32"):
        trainer.fit(X, Y, sample_weight=np.ones(31), epochs=1, verbose=0)


def test_sample_weights_of_the_wrong_shape_are_named():
    trainer = tfaccel.Trainer(linear, loss="mse")
    with pytest.raises(ValueError, match=r"sample_weight has shape \(32, 2\)"):
        trainer.fit(X, Y[:, 0], sample_weight=np.ones((32, 2)), epochs=1, verbose=0)
    data = tf.data.Dataset.from_tensor_slices((X, Y[:, 0], np.ones((32, 2), "float32"))).batch(8)
    with pytest.raises(ValueError, match=r"sample weights have shape \(None, 2\)"):
        trainer.fit(data, epochs=1, verbose=0)


def test_a_misspelt_feature_key_is_named_up_front():
    trainer = tfaccel.Trainer(linear, loss="mse")
    with pytest.raises(ValueError, match=r"keys \['featurse'\].*no feature for \['features'\]"):
        trainer.fit({"featurse": X}, Y, batch_size=8, epochs=1, verbose=0)


def test_the_label_check_calls_a_custom_loss_on_real_labels():
    def positive_targets(y_true, y_pred):
        tf.debugging.assert_positive(y_true, message="targets must be positive")
        return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

    trainer = tfaccel.Trainer(linear, loss=positive_targets, steps_per_loop=1)
    trainer.fit(X, np.abs(Y) + 1.0, batch_size=8, epochs=1, verbose=0)
    assert int(trainer.step.numpy()) == 4


# -- resume ----------------------------------------------------------------------------------


def _first_epoch(data):
    if callable(data) and not isinstance(data, tf.data.Dataset):
        data = data(tf.distribute.InputContext())
    return [int(v) for batch in data for v in batch[1].numpy()]


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_pipeline_seed_fixes_the_shuffle_whatever_the_global_seed(replicas, mirrored):
    from tensorflow.python.eager import context

    strategy = mirrored if replicas == 2 else None
    source = tfaccel.data.from_arrays(np.zeros((64, 2), "float32"), np.arange(64))
    orders = []
    for global_seed in (1, 2, None):
        if global_seed is not None:
            tf.random.set_seed(global_seed)
        tf.random.uniform([])  # other random work before the build
        data = tfaccel.data.pipeline(source, batch_size=8, training=True, seed=0, strategy=strategy)
        orders.append(_first_epoch(data))
        assert context.global_seed() == (global_seed or 2)  # left as it was
    assert orders[0] == orders[1] == orders[2]
    assert orders[0] != sorted(orders[0])  # shuffled


def _flip(x, y):
    return tf.image.random_flip_left_right(x), y


def _noise(x, y, seed):
    return x + tf.random.stateless_normal(tf.shape(x), seed), y


def _augmented(augment):
    images = np.random.default_rng(0).normal(size=(16, 4, 4, 1)).astype("float32")
    source = tfaccel.data.from_arrays(images, np.arange(16) % 2)
    return tfaccel.data.pipeline(source, batch_size=8, training=True, seed=0, augment=augment)


def _image_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 1))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))


def test_stateful_random_augmentation_warns_that_resume_is_not_exact(tmp_path):
    trainer = tfaccel.Trainer(_image_model, loss="sparse_categorical_crossentropy")
    with pytest.warns(UserWarning, match=r"stateful random ops \(RandomUniform\).*`seed` arg"):
        trainer.fit(_augmented(_flip), epochs=1, checkpoint_dir=str(tmp_path / "a"), verbose=0)


def test_stateless_seeded_augmentation_gives_no_resume_warning(tmp_path):
    import warnings

    trainer = tfaccel.Trainer(_image_model, loss="sparse_categorical_crossentropy")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*stateful random ops")
        trainer.fit(_augmented(_noise), epochs=1, checkpoint_dir=str(tmp_path / "b"), verbose=0)
    assert int(trainer.step.numpy()) == 2


class DeleteDirectory(keras.callbacks.Callback):
    def __init__(self, directory, at_batch):
        super().__init__()
        self.directory, self.at_batch, self.done = directory, at_batch, False

    def on_train_batch_end(self, batch, logs=None):
        if batch >= self.at_batch and not self.done:
            import shutil
            import threading

            for thread in threading.enumerate():  # the checkpoint being written first
                if thread.name.startswith("tfaccel-save"):
                    thread.join()
            shutil.rmtree(self.directory)
            self.done = True


def test_a_checkpoint_directory_deleted_while_training_is_made_again(tmp_path):
    directory = tmp_path / "ckpt"
    trainer = tfaccel.Trainer(linear, loss="mse", steps_per_loop=2)
    with pytest.warns(UserWarning, match="was deleted while this run trained.*made it again"):
        trainer.fit(
            X,
            Y,
            batch_size=8,
            epochs=2,
            shuffle=False,
            checkpoint_dir=str(directory),
            checkpoint_every=2,
            callbacks=[DeleteDirectory(directory, at_batch=2)],
            verbose=0,
        )
    assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-8")
    assert not (directory / "tfaccel.lock").exists()  # released at the end


def test_a_lock_refresh_on_a_full_disk_says_so_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import builtins
    import errno

    from tfaccel.train.state import lock as lock_module

    held = lock_module.DirectoryLock(str(tmp_path)).acquire()
    before = (tmp_path / "tfaccel.lock").read_text()

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_open(path, mode="r", *args, **kwargs):
        handle = builtins.open(path, mode, *args, **kwargs)
        return Full(handle) if "w" in mode else handle

    monkeypatch.setattr(lock_module, "open", full_open, raising=False)
    try:
        with pytest.raises(OSError, match="No space left on device.*ENOSPC.*left as it was"):
            held.refresh()
    finally:
        monkeypatch.undo()
        held.release()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary left; lock released
    assert '"token"' in before


class InterruptTwice(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch >= 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)


def test_a_second_ctrl_c_stops_at_once(capfd):
    trainer = tfaccel.Trainer(linear, loss="mse", steps_per_loop=1)
    with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
        trainer.fit(X, Y, batch_size=8, epochs=3, callbacks=[InterruptTwice()], verbose=0)
    assert not trainer.preempted and int(trainer.step.numpy()) == 2
    assert "Ctrl-C again stops at once" in capfd.readouterr().err
