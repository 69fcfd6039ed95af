"""What a pipeline build knows (`Built`), and sample weights carried through the pipeline."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import data
from tfaccel.data.assembly.pipeline import built_of

N = 10
X = np.arange(N, dtype="float32")[:, None]
Y = np.arange(N, dtype="int64")
W = (2.0 * np.arange(N) + 1.0).astype("float32")  # weight of example i: 2i + 1


def one_replica(**kwargs):
    kwargs.setdefault("training", False)
    dataset = data.pipeline(data.from_arrays(X, Y), batch_size=4, **kwargs)
    return built_of(dataset)


# -- Built ------------------------------------------------------------------------------


@pytest.mark.parametrize("drop, steps", [(False, 3), (True, 2)])  # 10 = 2*4 + 2
def test_built_on_one_replica_counts_steps_and_examples(drop, steps):
    built = one_replica(drop_remainder=drop)
    assert (built.steps, built.examples) == (steps, N)
    assert int(built.dataset.cardinality()) == steps
    assert str(built.plan) == str(data.plan_of(built.dataset))


@pytest.mark.parametrize("repeat, steps, examples", [(True, -1, None), (2, 5, 20)])
def test_built_of_a_repeated_pipeline(repeat, steps, examples):
    built = one_replica(repeat=repeat)
    assert (built.steps, built.examples) == (steps, examples)


def test_built_of_other_datasets_is_none():
    assert built_of(tf.data.Dataset.range(3).batch(2)) is None
    assert built_of(one_replica().dataset.map(lambda x, y: (x, y))) is None


@pytest.mark.parametrize("drop, steps", [(False, 3), (True, 2)])
def test_built_on_two_replicas_counts_the_distributed_steps(mirrored, drop, steps):
    fn = data.pipeline(
        data.from_arrays(X, Y),
        batch_size=4,
        training=True,
        seed=0,
        drop_remainder=drop,
        strategy=mirrored,
    )
    context = fn.input_context()
    assert (context.num_input_pipelines, context.input_pipeline_id) == (1, 0)
    assert context.num_replicas_in_sync == 2
    built = fn.build(context)
    assert (built.steps, built.examples) == (steps, N)
    assert built.dataset.element_spec == fn(context).element_spec
    iterated = sum(1 for _ in mirrored.distribute_datasets_from_function(fn))
    assert iterated == steps


def test_built_of_sharded_pipelines_counts_the_padding(mirrored):
    # 9 examples over 2 pipelines of 1 replica (batch 2 each): shards of 5 and 4 elements,
    # 3 and 2 batches; the second is padded to ceil(9 / 4) = 3 steps.
    x, y = X[:9], Y[:9]
    fn = data.pipeline(data.from_arrays(x, y), batch_size=4, training=True, strategy=mirrored)
    for index in (0, 1):
        built = fn.build(tf.distribute.InputContext(2, index, 2))
        assert (built.steps, built.examples) == (3, 9)
        assert sum(1 for _ in built.dataset) == 3
    assert "pad" in str(built.plan)


@pytest.mark.parametrize("drop", [False, True])
def test_the_probe_has_the_datasets_elements_and_reads_before_the_shuffle(mirrored, drop):
    fn = data.pipeline(
        data.from_arrays(X, Y),
        batch_size=4,
        training=True,
        seed=3,
        drop_remainder=drop,
        strategy=mirrored,
    )
    context = fn.input_context()
    built, untouched = fn.build(context), fn.build(context)
    assert built.probe.element_spec == built.dataset.element_spec
    probed = [y.numpy().tolist() for _, y in built.probe]
    assert probed == ([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]])  # per-replica, source order

    def two_epochs(dataset):
        return [[y.numpy().tolist() for _, y in dataset] for _ in range(2)]

    assert two_epochs(built.dataset) == two_epochs(untouched.dataset)  # the probe moved nothing
    single = one_replica(drop_remainder=drop)
    assert single.probe.element_spec == single.dataset.element_spec


# -- sample weights -----------------------------------------------------------------------


def test_from_arrays_with_weights_yields_triples():
    dataset = data.from_arrays(X, Y, sample_weight=W)
    assert len(dataset.element_spec) == 3
    assert [float(w) for _, _, w in dataset] == W.tolist()


@pytest.mark.parametrize(
    "weights, y, match",
    [(W[:5], Y, "same number of rows"), (np.ones((N, 3)), Y, "shape"), (W, None, "labels")],
)
def test_from_arrays_refuses_weights_not_one_per_example(weights, y, match):
    with pytest.raises(ValueError, match=match):
        data.from_arrays(X, y, sample_weight=weights)


def _examples(dataset):
    """`(x, y, w)` per example, in order, from batches of pairs or triples."""
    rows = []
    for batch in dataset:
        parts = [t.numpy() for t in batch]
        for i in range(len(parts[1])):
            rows.append(tuple(float(np.ravel(p[i])[0]) for p in parts))
    return rows


def _check_weights(weighted, plain, scale=1.0):
    assert [r[:2] for r in weighted] == plain  # the same (x, y), in the same order
    for x, y, w in weighted:
        assert w == 2 * y + 1 and x == y * scale  # the weight beside its own example


def scale_by_three(features, label):
    return features * 3.0, label


@pytest.mark.parametrize("training", [False, True])
def test_a_weighted_pipeline_on_one_replica_carries_each_weight(training):
    kwargs = dict(batch_size=4, training=training, seed=0, preprocess=scale_by_three)
    weighted = data.pipeline(data.from_arrays(X, Y, sample_weight=W), **kwargs)
    plain = data.pipeline(data.from_arrays(X, Y), **kwargs)
    _check_weights(_examples(weighted), _examples(plain), scale=3.0)


def _replica_examples(strategy, fn):
    rows = []
    for step in strategy.distribute_datasets_from_function(fn):
        for local in zip(*[strategy.experimental_local_results(t) for t in step], strict=True):
            rows.extend(_examples([local]))
    return rows


@pytest.mark.parametrize("shuffle_buffer", [None, "auto"])
def test_a_weighted_pipeline_on_two_replicas_carries_each_weight(mirrored, shuffle_buffer):
    kwargs = dict(
        batch_size=4,
        training=True,
        seed=0,
        preprocess=scale_by_three,
        shuffle_buffer=shuffle_buffer,
        strategy=mirrored,
    )
    weighted = data.pipeline(data.from_arrays(X, Y, sample_weight=W), **kwargs)
    plain = data.pipeline(data.from_arrays(X, Y), **kwargs)
    rows = _replica_examples(mirrored, weighted)
    _check_weights(rows, _replica_examples(mirrored, plain), scale=3.0)
    assert sorted(r[1] for r in rows) == Y.tolist()  # every example once, the last batch split


def test_weights_ride_through_augment_batch_map_check_finite_and_padding(mirrored):
    def flip(features, label, seed):
        return tf.image.stateless_random_flip_left_right(features[None, :, None], seed)[
            0, :, 0
        ], label

    def double(features, label):
        return features * 2.0, label

    x, y, w = X[:9], Y[:9], W[:9]
    fn = data.pipeline(
        data.from_arrays(x, y, sample_weight=w),
        batch_size=4,
        training=True,
        seed=1,
        augment=flip,
        batch_map=double,
        check_finite=True,
        strategy=mirrored,
    )
    for index in (0, 1):  # 2 pipelines: the second padded with an empty batch
        built = fn.build(tf.distribute.InputContext(2, index, 2))
        rows = _examples(built.dataset)
        assert built.steps == 3 and len(list(built.dataset)) == 3
        for features, label, weight in rows:
            assert weight == 2 * label + 1 and features == 2 * label
