"""`data.graph`, the one reader of tf.data's private attributes (layout: test_house.py)."""

import pathlib

import pytest
import tensorflow as tf

from tfaccel.data import graph
from tfaccel.data.order import augment_seeds

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfaccel"


def test_only_graph_reads_tf_datas_private_attributes():
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for name in ("_input_dataset", "_drop_remainder", "_map_func")
        if name in path.read_text()
    }
    assert readers == {"data/graph.py"}


def test_chain_is_newest_first_back_to_the_source():
    source = tf.data.Dataset.range(10)
    mapped = source.map(lambda x: x * 2)
    batched = mapped.batch(3)
    last = batched.prefetch(1)
    assert list(graph.chain(last)) == [last, batched, mapped, source]
    assert graph.input_of(source) is None and graph.input_of(mapped) is source


@pytest.mark.parametrize("drop", [False, True])
def test_batch_node_reads_size_remainder_and_parent(drop):
    mapped = tf.data.Dataset.range(10).map(lambda x: x + 1)
    node = graph.batch_node(mapped.batch(4, drop_remainder=drop).prefetch(2))
    assert (node.size, node.drop_remainder, node.parent) == (4, drop, mapped)
    assert graph.batch_node(mapped) is None


def test_static_batch_size_from_the_shape_or_the_graph():
    assert graph.static_batch_size(tf.data.Dataset.range(10).batch(4, drop_remainder=True)) == 4
    assert graph.static_batch_size(tf.data.Dataset.range(10).batch(4).map(lambda b: b)) == 4
    assert graph.static_batch_size(tf.data.Dataset.range(10)) is None


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda d: d.batch(4, drop_remainder=True), (2, 10)),  # 10 = 2*4 + 2
        (lambda d: d.map(lambda x: x).batch(3, drop_remainder=True).prefetch(1), (1, 10)),
        (lambda d: d.take(7).batch(5, drop_remainder=True), (2, 7)),
        (lambda d: d.batch(5, drop_remainder=True), None),  # divides evenly
        (lambda d: d.batch(4), None),  # the remainder is kept
        (lambda d: d.repeat().batch(4, drop_remainder=True), None),  # infinite
        (lambda d: d.filter(lambda x: x > 2).batch(4, drop_remainder=True), None),  # unknown
        (lambda d: d.repeat(3).batch(4, drop_remainder=True), (2, 30)),
        (lambda d: d, None),  # no batch
    ],
)
def test_dropped_per_epoch_hand_counted(build, expected):
    assert graph.dropped_per_epoch(build(tf.data.Dataset.range(10))) == expected


def test_batched_by_sees_batches_and_unbatches():
    source = tf.data.Dataset.range(10)
    assert graph.batched_by(source) is None
    assert graph.batched_by(source.batch(3).map(lambda b: b)) == 3
    assert graph.batched_by(source.padded_batch(2)) == 2
    assert graph.batched_by(source.batch(3).unbatch()) is None


def test_map_function_graphs_name_the_ops_of_each_map():
    source = tf.data.Dataset.range(4).map(lambda x: tf.cast(x, tf.float32))
    noisy = source.map(lambda x: x + tf.random.uniform([]))
    assert len(list(graph.map_function_graphs(noisy))) == 2
    assert augment_seeds.stateful_random_ops(noisy) == ["RandomUniform"]
    assert augment_seeds.stateful_random_ops(source) == []
