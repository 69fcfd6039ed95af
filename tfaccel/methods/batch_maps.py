"""Batch maps: functions over training batches, and running them over a dataset.

A batch map is `fn(x, y, seed) -> (x, y)`; `seed` is a shape-[2] int64 stateless seed,
its own for each batch and map, so random maps (MixUp, CutMix) are repeatable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

Batch = tuple[Any, Any]  # (features, labels) of one batch
MapFn = Callable[[Any, Any, Any], Batch]  # a batch map: fn(x, y, seed) -> (x, y)


@dataclasses.dataclass
class BatchMap:
    """One function over batches: `fn(x, y, seed) -> (x, y)`, `seed` a shape-[2] int64."""

    name: str
    fn: MapFn
    order: int  # smaller first: resizing (0) before one-hot (1) before mixing (2)
    reads_state: bool = False  # reads a variable a callback sets (resizing's image size)


def content_key(x: Any) -> tf.Tensor:
    """An int64 key of a batch's features: an order-sensitive sum of their bits.

    The same batch gives the same key in any run (integer arithmetic, exact), so a
    resumed run, which the Trainer feeds the same batches, mixes them the same way;
    a shuffled epoch gives other batches, hence other keys.
    """
    flat = tf.reshape(tf.cast(tf.nest.flatten(x)[0], tf.float32), [-1])
    bits = tf.cast(tf.bitcast(flat, tf.int32), tf.int64)
    weights = tf.range(tf.size(bits, out_type=tf.int64), dtype=tf.int64) % 1009 + 1
    return tf.reduce_sum(bits * weights)


def transform(data: Any, maps: list[BatchMap], seed: int) -> Any:
    """`data` (a batched dataset or a dataset function) with the batch maps applied.

    Map i of a batch gets the stateless seed `[seed + i, content_key(features)]`: random
    per batch (and per epoch when the data is shuffled), repeatable from `seed`, and the
    same again for the same batch in a resumed run. Unshuffled data is mixed alike every
    epoch. (tf.data's `Dataset.random` would change per epoch, but does not restore its
    per-epoch state from an iterator checkpoint; see `tfaccel.data.order.augment_seeds`.)
    """
    if not maps:
        return data
    if callable(data) and not isinstance(data, tf.data.Dataset):
        return lambda context: transform(data(context), maps, seed)
    maps = sorted(maps, key=lambda m: m.order)

    # Plain TensorFlow ops (no Python branch on a tensor), so AutoGraph's conversion, most
    # of the map's trace, is skipped (the start-up it saved: `composition.FAST_CARD`).
    @tf.autograph.experimental.do_not_convert
    def apply(*element: Any) -> tuple:
        x, y, *rest = element
        key = content_key(x)
        for i, batch_map in enumerate(maps):
            x, y = batch_map.fn(x, y, tf.stack([tf.constant(seed + i, tf.int64), key]))
        return (x, y, *rest)

    if not any(m.reads_state for m in maps):
        return data.map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # A map reading state a callback sets at an epoch's start runs when the step asks for
    # the batch (no parallel read-ahead into the next epoch); the state is a function of
    # the epoch, so an iterator checkpoint need not hold it.
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return data.map(apply).with_options(options)
