"""Batch maps: functions over training batches, and running them over a dataset.

A batch map is `fn(x, y, seed) -> (x, y)`; `seed` is a shape-[2] int64 stateless seed,
its own for each batch and map, so random maps (MixUp, CutMix) are repeatable.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass
class BatchMap:
    """One function over batches: `fn(x, y, seed) -> (x, y)`, `seed` a shape-[2] int64."""

    name: str
    fn: object
    order: int  # smaller first: resizing (0) before one-hot (1) before mixing (2)


def transform(data, maps, seed: int):
    """`data` (a batched dataset or a dataset function) with the batch maps applied.

    Each batch gets its own stateless seed `[r, i]` (map i) from
    `tf.data.Dataset.random(seed)`, reshuffled every epoch, so mixing is random per batch
    and epoch yet repeatable from `seed`.
    """
    if not maps:
        return data
    if callable(data) and not isinstance(data, tf.data.Dataset):
        return lambda context: transform(data(context), maps, seed)
    maps = sorted(maps, key=lambda m: m.order)
    draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)

    def apply(element, draw):
        x, y, *rest = element
        for i, batch_map in enumerate(maps):
            x, y = batch_map.fn(x, y, tf.stack([draw, tf.constant(i, tf.int64)]))
        return (x, y, *rest)

    zipped = tf.data.Dataset.zip((data, draws))
    return zipped.map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(
        tf.data.AUTOTUNE
    )
