"""Rows in memory are handed to the tf.data service's workers in strided chunks."""

import numpy as np
import tensorflow as tf

from tfaccel.data.service import splits as service_splits


def test_chunk_size_keeps_sixteen_splits_per_worker_and_a_ceiling():
    assert service_splits.chunk_rows(20000, 2) == 625
    assert service_splits.chunk_rows(10**7, 2) == service_splits.MAX_CHUNK
    assert service_splits.chunk_rows(20, 2) == 1
    assert service_splits.chunk_rows(640, None) == 20  # unknown worker count: as for 2


def test_every_row_is_in_exactly_one_chunk_and_each_chunk_strides_the_data():
    ids = np.arange(1003, dtype=np.int64)
    labels = np.repeat(np.arange(10), 101)[:1003]  # sorted by class
    source = tf.data.Dataset.from_tensor_slices((ids, labels))
    chunked, rows = service_splits.chunked(source, workers=2)
    assert rows == 31
    seen = [(int(i), int(c)) for i, c in chunked]
    assert sorted(i for i, _ in seen) == list(range(1003))
    assert all(labels[i] == c for i, c in seen)  # features and labels stay paired
    first_chunk = [c for _, c in seen[:rows]]
    assert len(set(first_chunk)) == 10  # a stride across class-sorted data: every class


def test_other_sources_and_tiny_ones_keep_their_own_splits():
    generated = tf.data.Dataset.range(100)
    assert service_splits.chunked(generated, 2) == (generated, None)
    tiny = tf.data.Dataset.from_tensor_slices(np.arange(20))
    assert service_splits.chunked(tiny, 2) == (tiny, None)
