"""`Feed`: the input of a call, built once; what it knows equals what the data holds."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import data
from tfaccel.data.assembly.feed import INFINITE, Feed

X = np.arange(70 * 4, dtype="float32").reshape(70, 4) / 100.0
Y = (np.arange(70) % 3).astype("int32")


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def _trainer(strategy):
    return tfaccel.Trainer(
        _model,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=strategy,
        steps_per_loop=1,
    )


class Counted:
    """A map function that counts its traces: one trace per pipeline build."""

    def __init__(self):
        self.traces = 0

    def __call__(self, x, y):
        self.traces += 1
        return x * 2.0, y


class CountedAugment(Counted):
    def __call__(self, x, y, seed):
        self.traces += 1
        return x + tf.random.stateless_uniform(tf.shape(x), seed, maxval=1e-3), y


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_fit_builds_pipeline_zero_once(replicas, mirrored):
    strategy = mirrored if replicas == 2 else tf.distribute.OneDeviceStrategy("/cpu:0")
    preprocess, augment = Counted(), CountedAugment()
    train = data.pipeline(
        data.from_arrays(X, Y),
        batch_size=10,
        training=True,
        seed=0,
        preprocess=preprocess,
        augment=augment,
        strategy=strategy,
    )
    assert preprocess.traces == 1  # pipeline() builds it to check the input
    _trainer(strategy).fit(train, epochs=2, verbose=0)
    assert preprocess.traces == 1  # the fit trains on that build: none more
    # augment: the training build and the label probe (read before the shuffle)
    assert augment.traces <= 2
    _trainer(strategy).fit(train, epochs=1, verbose=0)
    assert preprocess.traces == 1 + (replicas == 2)  # a second fit builds a fresh one


def test_what_a_feed_knows_on_two_replicas(mirrored):
    fn = data.pipeline(
        data.from_arrays(X, Y), batch_size=20, training=True, seed=1, strategy=mirrored
    )
    feed = Feed(fn, mirrored)
    assert feed.is_function
    assert feed.global_batch == 20
    assert feed.steps == 4  # ceil(70 / 20): the partial last batch kept
    assert not feed.drop_remainder and feed.dropped is None
    dropping = data.pipeline(
        data.from_arrays(X, Y),
        batch_size=20,
        training=True,
        drop_remainder=True,
        strategy=mirrored,
    )
    feed = Feed(dropping, mirrored)
    assert feed.steps == 3 and feed.dropped == (10, 70)
    assert feed.repeated().dataset.cardinality() == INFINITE


def test_a_dataset_and_a_dataset_function_of_the_user(mirrored):
    batched = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16, drop_remainder=True)
    feed = Feed(batched, tf.distribute.get_strategy())
    assert (feed.global_batch, feed.steps, feed.dropped) == (16, 4, (6, 70))

    def fn(context):  # per-replica batches of 8
        batch = context.get_per_replica_batch_size(16)
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch)

    feed = Feed(fn, mirrored)
    assert feed.global_batch == 16
    assert feed.steps == 5  # 9 per-replica batches, two a step


def test_the_distributed_feed_reads_what_a_fresh_build_reads(mirrored):
    def batches(distributed):
        out = []
        for batch in distributed:
            parts = mirrored.experimental_local_results(batch[0])
            out.append(np.concatenate([p.numpy() for p in parts]))
        return out

    make = lambda: data.pipeline(  # noqa: E731
        data.from_arrays(X, Y), batch_size=20, training=True, seed=3, strategy=mirrored
    )
    fresh = batches(mirrored.distribute_datasets_from_function(make()))
    ours = batches(Feed(make(), mirrored).distribute())
    assert len(ours) == len(fresh) == 4
    for a, b in zip(ours, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    skipped = batches(Feed(make(), mirrored).skipped(2).distribute())
    for a, b in zip(skipped, fresh[2:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_feed_refuses_what_is_not_data():
    with pytest.raises(TypeError, match="batched tf.data.Dataset or a dataset function"):
        Feed([1, 2, 3], tf.distribute.get_strategy())
    with pytest.raises(TypeError, match="not a tf.data.Dataset"):
        Feed(lambda context: [1, 2], tf.distribute.get_strategy())


def test_labels_are_checked_as_the_augment_makes_them(mirrored):
    def one_hot(x, y, seed):  # the augment changes the labels' form (as mixup does)
        return x, tf.one_hot(y, 3)

    train = data.pipeline(
        data.from_arrays(X, Y), batch_size=10, training=True, seed=0, augment=one_hot,
        strategy=mirrored,
    )  # fmt: skip
    trainer = tfaccel.Trainer(
        _model,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        strategy=mirrored,
    )
    feed = trainer.feed(train)  # the probe's labels are one-hot: the loss's check passes
    assert feed.probe.element_spec[1].shape.as_list() == [None, 3]
    history = trainer.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_a_stateful_augment_of_weighted_examples_sees_the_weight(mirrored):
    seen = []

    def reweigh(x, y, w):  # no seed: stateful; takes the weight
        seen.append(w.dtype)
        return x, y, w * 2.0

    w = np.ones(70, "float32")
    train = data.pipeline(
        data.from_arrays(X, Y, sample_weight=w), batch_size=10, training=True, seed=0,
        augment=reweigh, strategy=mirrored,
    )  # fmt: skip
    probe = Feed(train, mirrored).probe
    _, _, weights = next(iter(probe))
    assert weights.numpy().tolist() == [2.0] * 5
