"""tfaccel.data.from_generator (shards read in parallel) and the doctor's rewrites of a
pipeline's graph (the fix applied, to time it)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.data.assembly import plan
from tfaccel.doctor import variants

SPEC = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.int64))


def shard_of(count):
    def rows(shard, shards):
        for index in range(shard, count, shards):
            yield np.full((2,), index, np.float32), np.int64(index)

    return rows


def labels(dataset) -> list[int]:
    return [int(y) for _, y in dataset.as_numpy_iterator()]


def test_shards_are_read_together_in_a_fixed_order_when_asked():
    source = tfaccel.data.from_generator(shard_of(10), SPEC, shards=3, deterministic=True)
    # Round robin over the shards: 0, 1, 2 (each shard's first), 3, 4, 5, ...
    assert labels(source) == list(range(10))
    assert plan.graph_stages(source)[-1] == ("ParallelInterleave", 3)
    free = tfaccel.data.from_generator(shard_of(10), SPEC, shards=3, deterministic=False)
    assert sorted(labels(free)) == list(range(10))


def test_a_pipeline_over_shards_keeps_every_example_and_says_how_it_reads():
    source = tfaccel.data.from_generator(shard_of(20), SPEC, shards=4)
    ds = tfaccel.data.pipeline(source, batch_size=4, training=True, seed=1, shuffle_buffer=8)
    seen = sorted(int(v) for _, y in ds.as_numpy_iterator() for v in y)
    assert seen == list(range(20))
    text = tfaccel.data.explain(ds)
    assert "kind=generator" in text and "shards=4" in text and "read=4 at once" in text


def test_a_known_count_caps_the_automatic_shuffle_buffer():
    source = tfaccel.data.from_generator(shard_of(20), SPEC, shards=2, count=20)
    ds = tfaccel.data.pipeline(source, batch_size=5, training=True, seed=0)
    assert tfaccel.data.plan_of(ds).step("shuffle").settings["buffer"] == 20
    wrong = tfaccel.data.from_generator(shard_of(20), SPEC, shards=2, count=30)
    with pytest.raises(tf.errors.OpError, match="count=30, but the 2 shards"):
        labels(wrong)
    with pytest.raises(ValueError, match="count must be"):
        tfaccel.data.from_generator(shard_of(20), SPEC, shards=2, count=-1)


def test_one_generator_is_read_as_it_is():
    source = tfaccel.data.from_generator(lambda: shard_of(5)(0, 1), SPEC)
    assert labels(source) == [0, 1, 2, 3, 4]
    assert "Generator" in plan.graph_ops(source)


def test_bad_generators_are_named():
    with pytest.raises(TypeError, match="callable"):
        tfaccel.data.from_generator([1, 2], SPEC)
    with pytest.raises(ValueError, match="output_signature is required"):
        tfaccel.data.from_generator(lambda: iter(()), None)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="shards must be a positive int"):
            tfaccel.data.from_generator(shard_of(4), SPEC, shards=bad)
    with pytest.raises(TypeError, match=r"fn\(shard, num_shards\)"):
        tfaccel.data.from_generator(lambda: iter(()), SPEC, shards=2)
    with pytest.raises(TypeError, match="pass shards=N"):
        tfaccel.data.from_generator(shard_of(4), SPEC)


def test_the_rewritten_pipeline_holds_the_same_elements_read_in_parallel():
    def rows():
        for index in range(12):
            yield np.full((2,), index, np.float32), np.int64(index)

    def noisy(x, y):  # a random op: tf.data leaves the map on one core
        return x + tf.random.uniform((2,), maxval=1e-6), y

    foreign = tf.data.Dataset.from_generator(rows, output_signature=SPEC).map(noisy).batch(3)
    assert plan.graph_stages(foreign)[1:3] == [("Generator", 1), ("Map", 1)]
    maps = variants.parallel_maps(foreign)
    assert ("ParallelMap", -1) in plan.graph_stages(maps)
    assert sorted(labels(maps.unbatch())) == list(range(12))
    source = variants.parallel_source(foreign, 3)
    assert ("ParallelInterleave", 3) in plan.graph_stages(source)
    # Three copies of the generator, read at once: each example three times.
    assert sorted(labels(source.unbatch())) == sorted(list(range(12)) * 3)
    assert variants.parallel_maps(tf.data.Dataset.range(3).batch(2)) is None  # nothing to do
