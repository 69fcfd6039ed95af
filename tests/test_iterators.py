"""data.iterators: adopted iterators are freed on the reaper's thread, once unused; a
dataset for model.fit whose iterators are adopted (`freed_in_background`)."""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import iterators


class _Tracked:
    """Records the thread that deletes it."""

    freed_on: list = []

    def __del__(self):
        _Tracked.freed_on.append(threading.current_thread().name)


class _Blocking:
    """Its deletion waits for `release`, as an autotuned tf.data iterator's may."""

    def __init__(self, release: threading.Event):
        self.release = release

    def __del__(self):
        self.release.wait()


def _wait_until(condition) -> bool:
    # Waits on the effect: re-checked each time the reaper frees something (one
    # tf.data deletion may wait up to its autotuner's 60 s period).
    return iterators.wait_for(condition, timeout_s=180)


def test_an_adopted_object_is_freed_off_the_callers_thread_once_unused():
    _Tracked.freed_on.clear()
    obj = iterators.adopt(_Tracked())
    kept = obj
    del obj
    time.sleep(0.2)
    assert _Tracked.freed_on == []  # still referenced by `kept`: not freed
    del kept
    assert _wait_until(lambda: _Tracked.freed_on)
    assert _Tracked.freed_on == ["tfaccel-iterator-reaper"]


def test_a_slow_deletion_does_not_hold_up_the_next_one():
    _Tracked.freed_on.clear()
    release = threading.Event()
    slow = iterators.adopt(_Blocking(release))
    alive = weakref.ref(slow)
    del slow
    quick = iterators.adopt(_Tracked())
    del quick
    try:
        assert _wait_until(lambda: _Tracked.freed_on)  # not behind the blocked one
        assert alive() is not None and iterators.pending() >= 1  # that one still freeing
    finally:
        release.set()
    assert _wait_until(lambda: alive() is None)


def test_a_tf_data_iterator_keeps_working_and_is_freed():
    data = tf.data.Dataset.range(10).repeat().batch(2).prefetch(tf.data.AUTOTUNE)
    it = iterators.adopt(iter(data))
    assert [int(next(it)[0]) for _ in range(3)] == [0, 2, 4]

    @tf.function
    def total(iterator, n):
        return tf.reduce_sum([tf.reduce_sum(next(iterator)) for _ in range(n)])

    assert int(total(it, 2)) == (6 + 7) + (8 + 9)
    alive = weakref.ref(it)
    del it
    assert _wait_until(lambda: alive() is None)


def test_the_trainer_frees_its_iterators():
    import keras

    import tfaccel

    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    y = np.zeros(64, np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    adopted = []
    adopt = iterators.adopt

    def recording(iterator):
        adopted.append(weakref.ref(iterator))
        return adopt(iterator)

    iterators.adopt = recording  # counts this test's iterators only
    try:
        for _ in range(3):
            trainer.fit(data, epochs=1, steps_per_epoch=4, verbose=0, validation_data=data.take(2))
        trainer.evaluate(data.take(2))
    finally:
        iterators.adopt = adopt
    assert len(adopted) == 7  # 3 training, 3 validation, 1 evaluation
    assert _wait_until(lambda: all(ref() is None for ref in adopted))


def _digits_fit(wrap, epochs=3):
    """A small Dense model trained on scikit-learn's digits by `model.fit`."""
    import keras
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype("float32"), y.astype("int32")
    keras.utils.set_random_seed(0)  # before the shuffle: its order follows the global seed
    train = tf.data.Dataset.from_tensor_slices((x[:1200], y[:1200])).shuffle(1200, seed=1)
    val = tf.data.Dataset.from_tensor_slices((x[1200:], y[1200:])).batch(100)
    train, val = wrap(train.batch(32)), wrap(val)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(), loss, metrics=["accuracy"])
    history = model.fit(train, epochs=epochs, validation_data=val, verbose=0)
    return model.get_weights(), history.history


def test_a_dataset_freed_in_background_trains_model_fit_alike_and_frees_each_epoch():
    adopted, adopt = [], iterators.adopt

    def recording(iterator):
        adopted.append(weakref.ref(iterator))
        return adopt(iterator)

    iterators.adopt = recording
    try:
        freed_weights, freed_history = _digits_fit(iterators.freed_in_background)
    finally:
        iterators.adopt = adopt
    plain_weights, plain_history = _digits_fit(lambda ds: ds)
    for a, b in zip(freed_weights, plain_weights, strict=True):
        np.testing.assert_array_equal(a, b)  # the same elements in the same order
    assert freed_history == plain_history
    assert len(adopted) >= 3 * 2  # at least one training and one validation each epoch
    assert _wait_until(lambda: all(ref() is None for ref in adopted))


def test_model_fit_under_a_mirrored_strategy_takes_a_freed_dataset(mirrored):
    import keras

    with mirrored.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0.5).astype("int32"))).batch(16)
    history = model.fit(iterators.freed_in_background(data), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


def test_freed_in_background_keeps_the_dataset_and_refuses_other_input():
    data = tf.data.Dataset.range(6).batch(4)
    freed = iterators.freed_in_background(data)
    assert iterators.freed_in_background(freed) is freed  # wrapped once
    assert freed.element_spec == data.element_spec and int(freed.cardinality()) == 2
    assert [list(b.numpy()) for b in freed] == [[0, 1, 2, 3], [4, 5]]
    assert [int(b) for b in freed.unbatch().skip(4)] == [4, 5]  # transformed: a plain one
    with pytest.raises(TypeError, match="takes a tf.data.Dataset"):
        iterators.freed_in_background(np.zeros(3))


def test_a_process_exits_cleanly_with_an_iterator_being_freed(jobs):
    import sys

    code = (
        "import tensorflow as tf\n"
        "from tfaccel.data import iterators\n"
        "data = tf.data.Dataset.range(10**6).map(lambda v: v * 2).repeat()"
        ".batch(64).prefetch(tf.data.AUTOTUNE)\n"
        "for _ in range(3):\n"
        "    it = iterators.adopt(iter(data))\n"
        "    [next(it) for _ in range(20)]\n"
        "    del it\n"
        "print('done')\n"
    )
    done = jobs.run([sys.executable, "-c", code])  # a process of its own: conftest.py
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("done")
