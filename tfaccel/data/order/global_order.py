"""Elastic input: several input pipelines reading one global order by index.

With one input pipeline the training stream (the seeded shuffle's order, cut into
global batches) does not depend on how many replicas read it. Several pipelines (one
a worker) usually shard the data and shuffle each shard, so the global batches depend
on the worker count, and a run saved on 2 workers cannot continue exactly on 1 or 3.

Here, for a source that can be read by index (rows in memory: `from_arrays`, a plain
`Dataset.from_tensor_slices`), every pipeline shuffles the *indices* of the whole data
with the seed (the same buffer and seed as one pipeline would use: the same
permutation), cuts them into global batches, keeps its own slice of each (pipeline `w`
of `W` feeding `L` replicas of batch `b`: positions `[w·L·b, (w+1)·L·b)`), and only then
reads, preprocesses and augments its rows (the augment seeded by the epoch key over the
global order and the global index). The sequence of global batches is then a function of
(seed, epoch, global position) alone: the same on 1 pipeline or W, so a resume on any
worker count is exact. Each pipeline preprocesses only its slice, every epoch (an
in-memory source needs no cache).

Where the source cannot be read by index (files, generators, a file cache, a service)
or the order is not seeded, `reason_not` says why; such a run resumes exactly only on
the same number of input pipelines, and a changed count is refused at resume.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tfaccel.data import graph
from tfaccel.data.contracts import finite
from tfaccel.data.elements import AUTOTUNE, name, on_pairs
from tfaccel.data.order import augment_seeds

__all__ = ["GLOBAL", "order_of", "reason_not", "read"]

GLOBAL = "global"


def reason_not(config: Any) -> str | None:
    """Why a pipeline with `config` (a `stages.Config`) cannot read the global order over
    several input pipelines; None when it can."""
    if not config.training:
        return "evaluation data is sharded, not ordered"
    if not isinstance(config.source, tf.data.Dataset):
        return "the source is a function of the input context (it shards itself)"
    if graph.sliced_rows(config.source) is None:
        return (
            "the source cannot be read by index (only rows in memory can: from_arrays or "
            "Dataset.from_tensor_slices)"
        )
    if config.cache not in (None, "memory"):
        return "a file cache is read in order, not by index"
    if config.service is not None:
        return "a tf.data service reads the data"
    if config.shuffle_buffer is None:
        return "unshuffled, the augment keys come from a draw that is not global"
    if config.seed is None:
        return "the shuffle has no seed"
    return None


def order_of(s: Any) -> str:
    """ "global" when stream `s`'s global batches are the same on any number of input
    pipelines (workers), else why they are not (a resume must keep the worker count)."""
    if s.elastic:
        return GLOBAL
    return reason_not(s.config) or GLOBAL


def read(s: Any, buffer_size: int, buffer_reason: str) -> Any:
    """This pipeline's slice of the global order, read, preprocessed and augmented.

    Args:
        s: the stream (`stages.Stream`) of one of several input pipelines.
        buffer_size: the shuffle buffer one pipeline would use for the whole data.
        buffer_reason: how it was sized (for the plan).
    """
    config, rows = s.config, graph.sliced_rows(s.config.source)
    count = int(s.config.source.cardinality())
    order = tf.data.Dataset.range(count).shuffle(
        buffer_size, seed=config.seed, reshuffle_each_iteration=True
    )
    keyed = augment_seeds.keyed_by_order(order.map(lambda i: (i, i)), config.seed)
    keyed = keyed.map(lambda pair, key: (pair[0], key))
    width = s.batch * replicas_per_pipeline(s)
    start = s.index * width
    mine = (
        keyed.batch(config.batch_size, drop_remainder=config.drop_remainder)
        .map(lambda i, key: (i[start : start + width], key[start : start + width]))
        .unbatch()
    )
    load = _loader(s, rows)
    dataset = mine.map(load, num_parallel_calls=AUTOTUNE, deterministic=config.deterministic)
    s.dataset = dataset.apply(tf.data.experimental.assert_cardinality(slice_count(s, count)))
    s.plan.add(
        "order",
        by="global index permutation (elastic: the same global batches on any worker count)",
        shuffle_buffer=buffer_size,
        sizing=buffer_reason,
        seed=config.seed,
        slice=f"positions {start}..{start + width - 1} of each global batch",
    )
    if config.preprocess is not None:
        s.plan.add("preprocess", fn=name(config.preprocess), when="after the read, each epoch")
    if config.augment is not None:
        s.plan.add(
            "augment",
            fn=name(config.augment),
            random="stateless, seeded by (seed, epoch, global index)"
            if s.stateless
            else "stateful",
        )
    return s


def replicas_per_pipeline(s: Any) -> int:
    """The replicas one input pipeline feeds."""
    context = s.context
    return 1 if context is None else max(context.num_replicas_in_sync // s.pipelines, 1)


def slice_count(s: Any, count: int) -> int:
    """Elements this pipeline reads in one pass over `count` examples."""
    width, batch = s.batch * replicas_per_pipeline(s), s.config.batch_size
    full, rest = divmod(count, batch)
    if s.config.drop_remainder:
        return full * width
    return full * width + min(max(rest - s.index * width, 0), width)


def padding(s: Any, count: int) -> int:
    """Empty batches this pipeline appends so that it runs every step of the epoch."""
    if s.config.drop_remainder:
        return 0
    steps = math.ceil(count / s.config.batch_size)
    return steps - math.ceil(slice_count(s, count) / (s.batch * s.pieces))


def _loader(s, rows):
    """The function from (global index, epoch key) to one element, ready for batching."""
    config, spec = s.config, s.config.source.element_spec
    preprocess = None if config.preprocess is None else on_pairs(config.preprocess, spec, "x")
    after = spec
    if preprocess is not None:
        after = s.uncached.element_spec
    augment = None
    if config.augment is not None:
        keywords = {"seed": 0} if s.stateless else {}
        augment = on_pairs(config.augment, after, "augment", **keywords)
    where = f"the source (input pipeline {s.index} of {s.pipelines})"

    def load(index, key):
        element = tf.nest.map_structure(lambda t: tf.gather(t, index), rows)
        if preprocess is not None:
            element = finite.call(preprocess, element)
        if config.check_finite:
            element = finite.assert_finite(index, element, where)
        if augment is not None and s.stateless:
            element = finite.call(augment, element, seed=tf.stack([key, index]))
        elif augment is not None:
            element = finite.call(augment, element)
        return element

    return load
