"""`from_generator`: a Python generator as a source, read in parallel shards.

`tf.data.Dataset.from_generator` reads one element at a time: a generator that
waits (files, a network, a database) or decodes in Python makes every batch wait on
it. With `shards=N`, the generator function is called once per shard,
`fn(shard, N)`, and the N generators are read at once by an interleave: while one
waits, the others deliver. Python code that computes holds the GIL, so shards help
a generator that waits (I/O, sleeps, C libraries that release the GIL), not one
that computes in pure Python; `tfaccel.doctor` measures which.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data.sources.counted import Counted
from tfaccel.data.sources.info import SourceInfo, attach_source


def from_generator(
    fn: Callable,
    output_signature: Any,
    *,
    shards: int | None = None,
    deterministic: bool | None = None,
    count: int | None = None,
) -> tf.data.Dataset:
    """A source reading `fn`'s generator(s): one, or `shards` of them in parallel.

    Args:
        fn: without `shards`, a function of no arguments returning a generator (or any
            iterable); with `shards=N`, a function `fn(shard, num_shards)` returning the
            generator of shard `shard` (0..N-1) — each shard yields its own part of the data.
        output_signature: the elements' structure of `tf.TensorSpec`s, as
            `tf.data.Dataset.from_generator` takes it, e.g.
            `(tf.TensorSpec((28, 28), tf.float32), tf.TensorSpec((), tf.int64))`.
        shards: the number of generators read at once, or None for one.
        deterministic: with shards, True interleaves them in a fixed order (shard 0's
            first element, shard 1's first, ...), False takes whichever is ready first;
            None leaves it to the pipeline (`tfaccel.data.pipeline`'s `deterministic`).
        count: how many elements all shards yield together, if known. A generator's length
            is unknown to tf.data, so `pipeline(shuffle_buffer="auto")` would size the buffer
            by its memory budget alone and read that many elements before the first batch;
            with `count` the buffer is capped at it (and a wrong count fails when read).

    Returns:
        An unbatched dataset. Under several input pipelines (multi-worker),
        `tfaccel.data.pipeline` gives each pipeline its own shards, before reading.

    Raises:
        TypeError: `fn` is not callable, or takes the wrong number of arguments; a
            `deterministic` that is not a bool or None.
        ValueError: `shards` is not a positive int, or no `output_signature`. When read:
            a generator total other than `count` (naming any shard that yielded nothing).
    """
    if not callable(fn):
        raise TypeError(f"from_generator: fn must be callable, got {type(fn).__name__}.")
    if output_signature is None:
        raise ValueError(
            "from_generator: output_signature is required, e.g. "
            "(tf.TensorSpec((8,), tf.float32), tf.TensorSpec((), tf.int64))."
        )
    bad = isinstance(shards, bool) or not isinstance(shards, (int, type(None)))
    if bad or (shards is not None and shards < 1):
        raise ValueError(f"from_generator: shards must be a positive int or None, got {shards!r}.")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"from_generator: count must be an int >= 0 or None, got {count!r}.")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(
            f"from_generator: deterministic must be True, False or None, got {deterministic!r}."
        )
    _check_arity(fn, 0 if shards is None else 2)
    known = tf.data.experimental.assert_cardinality(count) if count is not None else None
    name = getattr(fn, "__name__", type(fn).__name__)
    fn = Counted(fn, count, shards) if count is not None else fn  # a wrong count= named
    if shards is None:
        dataset = tf.data.Dataset.from_generator(fn, output_signature=output_signature)
        dataset = dataset.apply(known) if known else dataset
        info = SourceInfo("generator", {"fn": name, "read": "one element at a time"})
        return attach_source(dataset, info)

    @tf.autograph.experimental.do_not_convert  # no control flow: traced as written
    def one_shard(shard):
        return tf.data.Dataset.from_generator(
            fn, output_signature=output_signature, args=(shard, shards)
        )

    def read(shard_ids: tf.data.Dataset) -> tf.data.Dataset:
        return shard_ids.interleave(
            one_shard,
            cycle_length=shards,
            block_length=1,
            num_parallel_calls=shards,
            deterministic=deterministic,
        )

    raw = tf.data.Dataset.range(shards)
    details = {"fn": name, "shards": shards, "read": f"{shards} at once"}
    info = SourceInfo("generator", details, raw=raw, finish=read, units="shards", count=shards)
    dataset = read(raw)
    return attach_source(dataset.apply(known) if known else dataset, info)


def _check_arity(fn: Callable, wanted: int) -> None:
    try:
        inspect.signature(fn).bind(*range(wanted))
    except TypeError:
        call = "fn()" if wanted == 0 else "fn(shard, num_shards)"
        raise TypeError(
            f"from_generator: {getattr(fn, '__name__', fn)!r} must be callable as {call}"
            + (" (pass shards=N to read it in shards)" if wanted == 0 else "")
            + "."
        ) from None
    except ValueError:  # no signature (a builtin): let TensorFlow call it
        return
