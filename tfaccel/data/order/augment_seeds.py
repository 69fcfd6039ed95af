"""Exact augmentations on resume: stateless random ops seeded by (seed, epoch, element index).

An `augment` function that takes a `seed` argument gets, for each element, a shape-[2]
int64 seed for `tf.random.stateless_*` / `tf.image.stateless_random_*`: a per-epoch key
in the first entry, the element's index in the second. Both must come back exactly when
a run resumes, whether it skips ahead (the Trainer) or restores a checkpointed iterator.

- After the data's shuffle, the key is a running hash of the pipeline seed and the
  element indices of this epoch so far, in shuffled order (a `scan`, whose state
  tf.data saves with the iterator). Each epoch's order differs, so its keys do.
- Without a shuffle, the key is drawn once per epoch from a small reshuffled range; a
  skip replays it exactly, a restored iterator checkpoint not always (see below).

Why not simpler: tf.data's `Dataset.random` does not restore its per-epoch state from a
checkpoint; a pipeline holding two reshuffling shuffles restores the wrong epoch order
from an iterator checkpoint (TensorFlow 2.21), so a pipeline gets one shuffle; and a
reshuffling shuffle zipped beside the data, re-created each epoch, is restored with the
wrong epoch now and then (tf.data autotuning; measured 7 exact restores in 16).

Example:
    >>> def augment(image, label, seed):                      # doctest: +SKIP
    ...     image = tf.image.stateless_random_flip_left_right(image, seed)
    ...     return image, label
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import tensorflow as tf
from tensorflow.python.eager import context

from tfaccel.data import graph
from tfaccel.data.contracts.finite import call

_T = TypeVar("_T")

KEY_RANGE, KEY_DRAWS = 256, 4  # unshuffled data: 256*255*254*253 distinct epoch keys
KEY_SEED_OFFSET = 7919  # keeps the key draws apart from a shuffle seeded alike upstream


@contextlib.contextmanager
def without_global_seed() -> Iterator[None]:
    """Random ops made inside ignore TensorFlow's global seed (`tf.random.set_seed`,
    `keras.utils.set_random_seed`): an op's own seed alone decides, whatever code ran
    before (tf.data's shuffle otherwise pairs its seed with the global one in force)."""
    eager = context.context()
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    saved = eager._seed, graph.seed if graph is not None else None
    eager._seed = None  # not set_seed: that would also reset unseeded ops' sequence
    if graph is not None:
        graph.seed = None
    try:
        yield
    finally:
        eager._seed = saved[0]
        if graph is not None:
            graph.seed = saved[1]


def own_seed(build: Callable[..., _T]) -> Callable[..., _T]:
    """Decorates `build(config, ...)` so that ops seeded by `config.seed` ignore TensorFlow's
    global seed (see `without_global_seed`): the same `seed` gives the same order after
    other code ran."""

    @functools.wraps(build)
    def built_with_own_seed(config: Any, *args: Any, **kwargs: Any) -> _T:
        if config.seed is None:  # unseeded: the global seed (if any) decides, as in tf.data
            return build(config, *args, **kwargs)
        with without_global_seed():
            return build(config, *args, **kwargs)

    return built_with_own_seed


STATEFUL_RANDOM_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "RandomShuffle",
        "RandomCrop",
        "Multinomial",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "ParameterizedTruncatedNormal",
        "StatefulUniform",
        "StatefulUniformInt",
        "StatefulUniformFullInt",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "RngReadAndSkip",
        "RngSkip",
    }
)
"""TensorFlow ops that draw from a hidden random state (a resumed run cannot replay them)."""


def stateful_random_ops(dataset: tf.data.Dataset) -> list[str]:
    """The stateful random ops in the map functions of `dataset`'s input chain (sorted).

    E.g. `["RandomStandardNormal", "RandomUniform"]` for an augment using `tf.random.normal`
    and `tf.image.random_flip_left_right`; [] for stateless ops (`tf.random.stateless_*`).
    """
    found = set()
    for definition in graph.map_function_graphs(dataset):
        ops = {n.op for n in definition.node}
        ops |= {n.op for f in definition.library.function for n in f.node_def}
        found |= ops & STATEFUL_RANDOM_OPS
    return sorted(found)


def takes_seed(fn: Callable) -> bool:
    """Whether `fn` accepts a `seed` keyword argument (then it gets stateless seeds)."""
    try:
        return "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def base_seed(seed: int | None) -> int:
    """The pipeline seed, or a fresh random one (then augmentations differ between runs)."""
    return int(seed) if seed is not None else random.SystemRandom().randrange(2**31)


def seeded_augment(
    indexed: tf.data.Dataset,
    augment: Callable,
    *,
    seed: int,
    shuffled: bool,
    pipelines: int,
    index: int,
    deterministic: bool,
) -> tf.data.Dataset:
    """Maps `augment(*element, seed=...)` with a seed per (seed, epoch, element index).

    Args:
        indexed: one epoch of `(element index, element)` pairs (`enumerate()` of the
            cached elements).
        augment: `fn(features, label, seed) -> (features, label)`.
        seed: the pipeline seed.
        shuffled: whether `indexed` was shuffled (reshuffled each epoch) since.
        pipelines: number of input pipelines; `index`: this one's id (the element index
            is made global so that shards draw different seeds).
        deterministic: keep the parallel map in order.
    """
    keyed = keyed_by_order(indexed, seed) if shuffled else _keyed_by_draw(indexed, seed)

    def with_seed(pair, epoch_key):
        position, element = pair
        element_seed = tf.stack([epoch_key, position * pipelines + index])
        return call(augment, element, seed=element_seed)

    augmented = keyed.map(
        with_seed, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
    )
    count = int(indexed.cardinality())
    if count >= 0:  # zip and scan can hide the length; batching and the Trainer need it
        augmented = augmented.apply(tf.data.experimental.assert_cardinality(count))
    return augmented


def keyed_by_order(indexed: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """`(pair, key)`: the key hashes the seed and the indices seen so far this epoch."""
    start = tf.constant([seed % 2**31, KEY_SEED_OFFSET], tf.int64)

    def fold(state, pair):
        state = tf.random.experimental.stateless_fold_in(state, pair[0])
        return state, (pair, state[0])

    return indexed.scan(start, fold)


def _keyed_by_draw(indexed: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """`(pair, key)`: one key per epoch, the first entries of a fresh permutation."""
    high = tf.constant((seed % 2**31) * 2**32, tf.int64)
    # The key is repeated alongside the epoch's elements, so the shuffle that drew it
    # stays alive (and is saved with the iterator) for the whole epoch.
    draws = tf.data.Dataset.range(KEY_RANGE).shuffle(
        KEY_RANGE, seed=seed + KEY_SEED_OFFSET, reshuffle_each_iteration=True
    )
    weights = KEY_RANGE ** tf.range(KEY_DRAWS, dtype=tf.int64)
    keys = draws.batch(KEY_RANGE).flat_map(
        lambda permutation: tf.data.Dataset.from_tensors(
            high + tf.reduce_sum(permutation[:KEY_DRAWS] * weights)
        ).repeat()
    )
    return tf.data.Dataset.zip(indexed, keys)


def warn_if_random_state(sample: tf.data.Dataset, checkpoint_dir: str | None) -> None:
    """Warns when the input draws random numbers that a resumed run cannot replay."""
    ops = stateful_random_ops(sample)
    if ops:
        warnings.warn(
            f"The training data's map functions use stateful random ops ({', '.join(ops)}), "
            "e.g. an augment without a `seed` argument: a run resumed from "
            f"{checkpoint_dir} will not get the random numbers an uninterrupted run would, "
            "so it will not be exact. Give augment a `seed` argument and use stateless ops "
            "(tf.random.stateless_*, tf.image.stateless_random_*): tfaccel.data.pipeline "
            "then passes each element its own seed.",
            stacklevel=5,
        )
