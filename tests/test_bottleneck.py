"""callbacks.Bottleneck: each epoch's time shares and verdict, in model.fit and the Trainer."""

import glob
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from sleep_layer import Sleep

import tfaccel
from tfaccel import callbacks as cb
from tfaccel.callbacks import _fit_wait

X = np.random.default_rng(0).normal(size=(512, 16)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")
SHARES = ("bottleneck_input_share", "bottleneck_step_share", "bottleneck_host_share")


def small():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(2, activation="softmax")])


def slow_step(seconds=0.1):
    """A planted compute bottleneck: the small model with a step of `seconds` (sleep)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((16,)), Sleep(seconds), keras.layers.Dense(2, activation="softmax")]
    )


def slow_input(batch=128):
    """A planted input bottleneck: 100 ms of Python per batch, one at a time, no prefetch.

    Long beside the small model's step (~1 ms) even on a busy host, where 20 ms batches
    were once outrun by a mirrored step slowed down by other jobs.
    """

    def sleep(x):
        time.sleep(0.1)
        return x

    def slow(x, y):
        x = tf.py_function(sleep, [x], tf.float32)
        x.set_shape([None, 16])
        return x, y

    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch).map(slow)


def fast_input():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(128).cache().prefetch(2)


def compiled(build, strategy=None, **compile_args):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = build()
        model.compile("sgd", "sparse_categorical_crossentropy", **compile_args)
    return model


def trainer(build, strategy=None, **kwargs):
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
        steps_per_loop=1,
        **kwargs,
    )


def check_shares(history, bottleneck, epochs=2):
    for key in SHARES:
        assert len(history[key]) == epochs, key
    for epoch in range(epochs):
        total = sum(history[key][epoch] for key in SHARES)
        assert total == pytest.approx(1.0)
        assert all(0 <= history[key][epoch] <= 1 for key in SHARES)
    assert len(bottleneck.verdicts) == epochs and len(bottleneck.epochs) == epochs


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_slow_input_is_named_in_model_fit(distributed, mirrored):
    bottleneck = cb.Bottleneck(verbose=0)
    model = compiled(small, mirrored if distributed else None)
    history = model.fit(slow_input(), epochs=2, verbose=0, callbacks=[bottleneck]).history
    check_shares(history, bottleneck)
    assert bottleneck.verdicts[-1] == "input"
    last = bottleneck.epochs[-1]
    assert last["input_share"] > last["step_share"] and last["input_share"] > last["host_share"]
    # The model's own train function is back after the run.
    assert not hasattr(model.train_function, _fit_wait.ORIGINAL)


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_slow_input_is_named_in_the_trainer(distributed, mirrored):
    bottleneck = cb.Bottleneck(verbose=0)
    strategy = mirrored if distributed else None
    history = trainer(small, strategy).fit(
        slow_input(), epochs=2, verbose=0, callbacks=[bottleneck]
    )
    check_shares(history.history, bottleneck)
    assert bottleneck.verdicts[-1] == "input"
    last = bottleneck.epochs[-1]
    assert last["input_share"] > last["host_share"]


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_cached_input_and_a_large_model_is_compute(loop, capsys):
    # The step sleeps 100 ms (planted): a cached batch and the host's per-call work stay far
    # under a fifth of it on a busy host (a real large model's step shrank beside them once).
    bottleneck = cb.Bottleneck()
    if loop == "fit":
        model = compiled(slow_step)
    else:
        model = trainer(slow_step, jit_compile=False)
    history = model.fit(fast_input(), epochs=2, verbose=0, callbacks=[bottleneck])
    check_shares(history.history, bottleneck)
    assert bottleneck.verdicts[-1] == "compute"
    last = bottleneck.epochs[-1]
    assert last["step_share"] > last["input_share"] and last["step_share"] > last["host_share"]
    assert "Bottleneck: epoch 1: compute (input " in capsys.readouterr().out


class SlowBatchEnd(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.1)  # ~100x the small model's step, as the slow input's 100 ms


def test_a_slow_callback_is_host():
    bottleneck = cb.Bottleneck(verbose=0)
    callbacks = cb.ordered([SlowBatchEnd(), bottleneck])  # Bottleneck first: the sleep is after
    compiled(small).fit(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(128).cache(),
        epochs=2,
        verbose=0,
        callbacks=callbacks,
    )
    assert bottleneck.verdicts[-1] == "host"
    assert bottleneck.epochs[-1]["host_share"] > bottleneck.epochs[-1]["step_share"]


def test_many_steps_per_execution_cannot_see_input():
    bottleneck = cb.Bottleneck(verbose=0)
    model = compiled(small, steps_per_execution=4)
    with pytest.warns(UserWarning, match="wait for input cannot be separated"):
        history = model.fit(slow_input(), epochs=2, verbose=0, callbacks=[bottleneck]).history
    assert "bottleneck_input_share" not in history
    assert bottleneck.epochs[-1]["input_share"] is None
    assert bottleneck.verdicts[-1] in ("host", "compute")
    assert history["bottleneck_step_share"][-1] + history["bottleneck_host_share"][
        -1
    ] == pytest.approx(1.0)


def test_tensorboard_scalars_and_verdict_text(tmp_path):
    bottleneck = cb.Bottleneck(log_dir=tmp_path / "bn", verbose=0)
    compiled(small).fit(slow_input(128), epochs=2, verbose=0, callbacks=[bottleneck])
    tags = {}
    for path in glob.glob(str(tmp_path / "bn" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    for key in ("input", "step", "host"):
        assert tags[f"bottleneck/{key}_share"] == [0, 1]
    assert tags["bottleneck/verdict"] == [0, 1]


def test_a_one_call_epoch_keeps_its_warm_up_call():
    # One batch per epoch: the first (tracing) call is the epoch's only one, so it counts.
    bottleneck = cb.Bottleneck(verbose=0)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(512)
    history = compiled(small).fit(data, epochs=2, verbose=0, callbacks=[bottleneck]).history
    assert bottleneck.epochs[0]["includes_warmup"] and not bottleneck.epochs[1]["includes_warmup"]
    check_shares(history, bottleneck)


def test_a_stale_wrapper_removes_itself():
    # A run that crashed before on_train_end leaves the wrapper: the next plain fit
    # (no Bottleneck) puts the model's own train function back and trains as usual.
    model = compiled(small)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(128)
    model.fit(data, epochs=1, verbose=0)
    original = model.train_function
    bottleneck = cb.Bottleneck(verbose=0)
    bottleneck.set_model(model)
    bottleneck.on_train_begin()  # installs, as fit would
    assert getattr(model.train_function, _fit_wait.ORIGINAL) is original
    history = model.fit(data, epochs=1, verbose=0).history
    assert model.train_function is original and np.isfinite(history["loss"][0])


def test_ordered_puts_bottleneck_first():
    csv = keras.callbacks.CSVLogger("unused.csv")
    bottleneck = cb.Bottleneck()
    assert cb.ordered([csv, bottleneck]) == [bottleneck, csv]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_threshold": 0}, r"input_threshold must be in \(0, 1\)"),
        ({"input_threshold": 1.5}, r"input_threshold must be in \(0, 1\)"),
        ({"host_threshold": "0.2"}, r"host_threshold must be a number in \(0, 1\)"),
        ({"host_threshold": True}, r"host_threshold must be a number"),
        ({"log_dir": 3}, r"log_dir must be a folder path"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cb.Bottleneck(**kwargs)


def test_verdict_rule():
    from tfaccel.callbacks.bottleneck import verdict

    assert verdict({"input": 0.5, "step": 0.4, "host": 0.1}, 0.2, 0.2) == "input"
    assert verdict({"input": 0.25, "step": 0.4, "host": 0.35}, 0.2, 0.2) == "host"
    assert verdict({"input": 0.1, "step": 0.8, "host": 0.1}, 0.2, 0.2) == "compute"
    assert verdict({"input": None, "step": 0.7, "host": 0.3}, 0.2, 0.2) == "host"
    assert verdict({"input": 0.15, "step": 0.85, "host": 0.0}, 0.1, 0.2) == "input"


def test_the_timed_fetch_trains_the_same_steps():
    # model.fit through the timed fetch: the same steps, losses and weights as without it.
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(64)
    runs = []
    for callbacks in ([], [cb.Bottleneck(verbose=0)]):
        model = compiled(small)
        history = model.fit(data, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
        runs.append((int(model.optimizer.iterations.numpy()), history.history["loss"], model))
    (steps, losses, plain), (timed_steps, timed_losses, timed) = runs
    assert steps == timed_steps == 16 and losses == timed_losses
    for a, b in zip(plain.weights, timed.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_data_of_unknown_length_ends_its_epochs(distributed, mirrored):
    # No cardinality: Keras learns the epoch's end from the fetch that finds no batch.
    data = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: True).batch(64)
    bottleneck = cb.Bottleneck(verbose=0)
    model = compiled(small, mirrored if distributed else None)
    with pytest.warns(UserWarning, match="ran out of data"):
        history = model.fit(data, epochs=2, verbose=0, callbacks=[bottleneck]).history
    assert int(model.optimizer.iterations.numpy()) == 16
    check_shares(history, bottleneck)
