"""Keeping the partial last batch on several replicas and workers, epoch by epoch exact.

A `DatasetFn` yields per-replica batches; the distributed iterator hands consecutive
ones to the replicas of a step. When an epoch's per-replica batches do not fill the
last step, the Trainer's repeated stream would hand the next epoch's first batch to
the idle replicas, mixing epochs. So, keeping the remainder:

- one input pipeline feeding k replicas batches k per-replica batches at once and
  splits each into k contiguous pieces (a full batch: the same examples as k
  per-replica batches; the partial one: k pieces differing by at most one example);
- several input pipelines (workers), each sharding the elements, hold batch counts
  that can differ by one: a pipeline with fewer is padded with empty batches to
  `ceil(examples / global batch)`, so every step of the epoch ends on every worker
  together. That needs the element count and the element shapes before batching.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tfaccel.data.sources.info import source_info

# These functions hold no tensor-dependent Python control flow: traced as written. AutoGraph's
# conversion (tf.data's default) cost 0.38 s of the first `fit` on two replicas here.
_plain = tf.autograph.experimental.do_not_convert


def can_even_shards(source: Any) -> bool:
    """Whether the shards of `source` can be padded to equal batch counts: a dataset of
    known length sharded by element, every component's shape known."""
    if not isinstance(source, tf.data.Dataset):
        return False
    info = source_info(source)
    count = info.count if info is not None and info.raw is None else None
    if count is None:
        count = int(source.cardinality())
    return count >= 0 and _fully_defined(source.element_spec)


def _fully_defined(spec) -> bool:
    return all(
        isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in tf.nest.flatten(spec)
    )


def split(dataset: tf.data.Dataset, pieces: int) -> tf.data.Dataset:
    """Each batch as `pieces` contiguous batches (sizes differing by at most one)."""

    @_plain
    def cut(*batch):
        element = batch if len(batch) > 1 else batch[0]
        size = tf.cast(tf.shape(tf.nest.flatten(element)[0])[0], tf.int64)

        @_plain
        def piece(i):
            start, end = (i * size) // pieces, ((i + 1) * size) // pieces
            return tf.nest.map_structure(lambda t: t[start:end], element)

        return tf.data.Dataset.range(pieces).map(piece)

    return dataset.flat_map(cut)


def split_even(dataset: tf.data.Dataset, pieces: int) -> tf.data.Dataset:
    """Each full batch (a static size divisible by `pieces`) as `pieces` contiguous
    batches of static size, as XLA (`drop_remainder=True`) needs."""

    @_plain
    def cut(*batch):
        element = batch if len(batch) > 1 else batch[0]
        return tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(
                lambda t: tf.reshape(t, [pieces, t.shape[0] // pieces, *t.shape[1:]]), element
            )
        )

    return dataset.flat_map(cut)


def shard_padding(count: int, pipelines: int, index: int, pipeline_batch: int) -> int:
    """Empty batches pipeline `index` needs so all pipelines run the same number of steps."""
    shard = count // pipelines + (1 if index < count % pipelines else 0)
    steps = math.ceil(count / (pipeline_batch * pipelines))
    return steps - math.ceil(shard / pipeline_batch)


def pad(dataset: tf.data.Dataset, batches: int) -> tf.data.Dataset:
    """`dataset` followed by `batches` empty batches of its element structure.

    Raises:
        ValueError: an element shape is not known (then the batch counts cannot be evened).
    """
    spec = dataset.element_spec
    if not all(
        isinstance(s, tf.TensorSpec) and s.shape[1:].is_fully_defined()
        for s in tf.nest.flatten(spec)
    ):
        raise ValueError(
            f"The workers' shards hold batch counts that differ, and the batches' shapes "
            f"({spec}) are not known, so they cannot be padded to one count. Pass "
            "drop_remainder=True to tfaccel.data.pipeline (the partial batches are dropped)."
        )
    empty = tf.nest.map_structure(lambda s: tf.zeros([0, *s.shape[1:]], s.dtype), spec)
    return dataset.concatenate(tf.data.Dataset.from_tensors(empty).repeat(batches))
