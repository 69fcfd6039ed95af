"""`pipeline`: the input pipeline a tf.data expert would write, in a fixed order.

shard (several input pipelines) → preprocess (parallel map) → cache → augment
(training) → shuffle (training, reshuffled each epoch) → repeat → batch →
batch_map (vectorised) → prefetch(AUTOTUNE).

Example:
    >>> ds = pipeline(from_arrays(x, y), batch_size=64, training=True,
    ...               preprocess=normalize, augment=flip)      # doctest: +SKIP
    >>> print(explain(ds))                                      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data import augment_seeds, fingerprint, finite, partial, sizing
from tfaccel.data import cache as cache_lib
from tfaccel.data.elements import AUTOTUNE, is_pair, require_pair
from tfaccel.data.plan import Plan, attach
from tfaccel.data.source_info import source_info

Source = tf.data.Dataset | Callable[[tf.distribute.InputContext | None], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class _Config:
    source: Any
    batch_size: int
    training: bool
    preprocess: Callable | None
    augment: Callable | None
    cache: str | None
    shuffle_buffer: int | str | None
    shuffle_budget_mb: float
    seed: int | None
    deterministic: bool
    repeat: bool | int
    drop_remainder: bool
    batch_map: Callable | None
    replicas: int
    check_finite: bool = False
    cache_mismatch: str = "rebuild"


class DatasetFn:
    """A `distribute_datasets_from_function`-ready pipeline for several replicas.

    Calling it with a `tf.distribute.InputContext` builds this input pipeline's
    dataset: its shard of the data (when there are several input pipelines) in
    per-replica batches of `global_batch_size / num_replicas_in_sync`.

    Attributes:
        global_batch_size: the batch summed over all replicas.
        strategy: the strategy it was built for.
        drop_remainder: whether the last partial batch is dropped.
        training: whether it augments and shuffles.
    """

    def __init__(self, config: _Config, strategy: tf.distribute.Strategy):
        self._config = config
        self.global_batch_size = config.batch_size
        self.strategy = strategy
        self.drop_remainder = config.drop_remainder
        self.training = config.training

    def __call__(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset, plan = _build(self._config, input_context)
        return attach(dataset, plan)

    def distribute(self) -> tf.distribute.DistributedDataset:
        """Returns `strategy.distribute_datasets_from_function(self)`."""
        return self.strategy.distribute_datasets_from_function(self)

    def plan(self) -> Plan:
        """The plan of input pipeline 0 (what `explain` prints)."""
        workers = int(getattr(self.strategy.extended, "_num_workers", 1) or 1)
        context = tf.distribute.InputContext(
            num_input_pipelines=workers,
            input_pipeline_id=0,
            num_replicas_in_sync=self._config.replicas,
        )
        return _build(self._config, context)[1]

    def __repr__(self) -> str:
        return (
            f"DatasetFn(global_batch_size={self.global_batch_size}, "
            f"replicas={self._config.replicas}, training={self.training}, "
            f"drop_remainder={self.drop_remainder})"
        )


def pipeline(
    source: Source,
    *,
    batch_size: int,
    training: bool,
    preprocess: Callable | None = None,
    augment: Callable | None = None,
    cache: str | os.PathLike | None = "memory",
    shuffle_buffer: int | str | None = "auto",
    seed: int | None = None,
    deterministic: bool | None = None,
    repeat: bool | int = False,
    drop_remainder: bool | None = None,
    strategy: tf.distribute.Strategy | None = None,
    batch_map: Callable | None = None,
    jit_compile: bool = False,
    shuffle_budget_mb: float = sizing.SHUFFLE_BUDGET_MB,
    check_finite: bool = False,
    cache_mismatch: str = "rebuild",
) -> tf.data.Dataset | DatasetFn:
    """Builds a batched, prefetched input pipeline in the correct order.

    Order: shard → preprocess → cache → augment → shuffle → repeat → batch →
    batch_map → prefetch. `preprocess`, `augment` and `batch_map` are called like
    `Dataset.map` functions: `fn(features, label) -> (features, label)` for pairs.

    Args:
        source: a dataset of `(features, label)` (e.g. from `from_arrays`), or a
            function `input_context -> dataset` (None without a strategy) that
            shards itself, e.g. `lambda ctx: from_tfds("mnist", "train",
            input_context=ctx)`. Datasets from tfaccel file sources are sharded by
            file, before decoding; other datasets by element.
        batch_size: the global batch, summed over replicas.
        training: True shuffles and augments; False does neither.
        preprocess: deterministic per-element work, cached (decode, normalise).
        augment: random per-element work, run after the cache so each epoch
            differs. Only with `training=True`: augmenting evaluation data is a
            bug, so it raises. When it takes a `seed` argument
            (`fn(features, label, seed)`), it gets a shape-[2] int64 seed per
            element, derived from (seed, epoch, element index), for
            `tf.random.stateless_*` / `tf.image.stateless_random_*` ops: a resumed
            run then sees the same augmentations bit for bit. Stateful random ops
            (`tf.random.uniform`...) make resume exact only for the data order.
        cache: "memory", a file path prefix (its directory must exist; a lock
            left by an interrupted run is removed with a warning; each input
            pipeline of several gets its own `-pipeline<i>of<n>` suffix), or None.
            A file cache records what it holds in `<path>.fingerprint.json` (see
            `tfaccel.data.cache`): one built from other data is never read.
        shuffle_buffer: "auto" (see `tfaccel.data.sizing`), a positive int, or
            None for no shuffle. Ignored when not training.
        seed: shuffle seed; with `deterministic=True` the element order is the
            same on every run (and still differs between epochs).
        deterministic: keep parallel maps in order. None → True when a seed is
            given or when not training, else False (faster training input).
        repeat: True repeats for ever, an int repeats that many times.
        drop_remainder: None → True only when training with `jit_compile` (XLA needs
            static shapes), else False: the partial last batch is kept, as `model.fit`
            keeps it (the Trainer trains it exactly on any number of replicas). With
            True, the Trainer warns with the number of examples dropped each epoch.
        strategy: a `tf.distribute.Strategy`; with more than one replica in sync
            (or multi-worker) a `DatasetFn` is returned instead of a dataset.
        batch_map: vectorised per-batch function (e.g. mixup).
        jit_compile: whether the model is XLA-compiled (for `drop_remainder`).
        shuffle_budget_mb: memory the shuffle buffer may use, MiB per pipeline.
        check_finite: fail on the first element whose (floating) features or label
            hold NaN or inf, naming its index in the source and which, with a
            `tf.errors.InvalidArgumentError` when the data is read. Off by default:
            it costs one `is_finite` pass over every element (before the
            cache, so once when cached; every epoch without a cache).
        cache_mismatch: what a file cache built from other data (another source
            fingerprint, element shape/dtype or preprocess, or no fingerprint file)
            gets: "rebuild" (its files are removed, with a `CacheMismatchWarning`)
            or "error" (`CacheMismatchError`).

    Returns:
        A `tf.data.Dataset` of global batches, or a `DatasetFn` producing
        per-replica batches. `explain(result)` prints the plan.

    Raises:
        ValueError: `batch_size` not a positive int or not divisible by the
            replicas, a `seed` that is not None or an integer >= 0, `augment` with
            `training=False`, a bad `cache` / `shuffle_buffer` / `repeat` /
            `cache_mismatch`, or a shuffle buffer over the budget.
        CacheMismatchError: with `cache_mismatch="error"`, a file cache of other data.
        FileNotFoundError: the cache path's directory does not exist.
        PermissionError: the cache path's directory cannot be written.
        TypeError: `source` is not a dataset or function, training elements are
            not `(features, label)` pairs, or `preprocess` / `augment` /
            `batch_map` does not take one argument per element component.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(
            f"batch_size must be a positive int (the global batch), got {batch_size!r}."
        )
    replicas = int(strategy.num_replicas_in_sync) if strategy is not None else 1
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is the global batch and must divide evenly over the "
            f"{replicas} replicas in sync; use a multiple of {replicas}, e.g. "
            f"{batch_size + replicas - batch_size % replicas}."
        )
    if augment is not None and not training:
        raise ValueError(
            "augment was given with training=False: evaluation data must not be randomly "
            "augmented. Drop augment= for this pipeline (put deterministic work in "
            "preprocess=)."
        )
    if not isinstance(source, tf.data.Dataset) and not callable(source):
        raise TypeError(
            f"source must be a tf.data.Dataset or a function input_context -> Dataset, got "
            f"{type(source).__name__}. Use tfaccel.data.from_arrays(x, y) for arrays."
        )
    if isinstance(repeat, bool) or repeat is None:
        repeat = bool(repeat)
    elif not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be True/False or a positive int, got {repeat!r}.")
    sizing.check_request(shuffle_buffer)
    if cache_mismatch not in cache_lib.MISMATCH_MODES:
        raise ValueError(
            f"cache_mismatch must be one of {cache_lib.MISMATCH_MODES}, got {cache_mismatch!r}."
        )
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if drop_remainder is None:  # kept unless XLA, or workers' shards that cannot be evened
        uneven = multi_worker and not partial.can_even_shards(source)
        drop_remainder = bool(training and (jit_compile or uneven))
    config = _Config(
        source=source,
        batch_size=batch_size,
        training=bool(training),
        preprocess=preprocess,
        augment=augment,
        cache=cache_lib.check_cache(cache),
        shuffle_buffer=shuffle_buffer if training else None,
        shuffle_budget_mb=shuffle_budget_mb,
        seed=_check_seed(seed),
        deterministic=(seed is not None or not training)
        if deterministic is None
        else deterministic,
        repeat=repeat,
        drop_remainder=bool(drop_remainder),
        batch_map=batch_map,
        replicas=replicas,
        check_finite=bool(check_finite),
        cache_mismatch=cache_mismatch,
    )
    if replicas > 1 or multi_worker:
        fn = DatasetFn(config, strategy)
        fn.plan()  # builds pipeline 0 once so that bad input fails here, not in the Trainer
        return fn
    dataset, plan = _build(config, None)
    return attach(dataset, plan)


def _check_seed(seed) -> int | None:
    """The seed as an int in [0, 2**63), or None; raises ValueError for anything else."""
    if seed is None:
        return None
    try:
        number = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        number = None
    if number is None or not 0 <= number < 2**63:
        raise ValueError(
            f"seed must be None or an integer in [0, 2**63), got {seed!r}. Pass e.g. seed=0 "
            "(a fixed shuffle order), or seed=None for a new order each run."
        )
    return number


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _check_arity(fn: Callable, element_spec: Any, what: str) -> None:
    """Raises TypeError when `fn` cannot take the element's components as arguments.

    `Dataset.map` unpacks a tuple element into positional arguments, so a pair
    calls `fn(features, label)` and anything else calls `fn(element)`.
    """
    count = len(element_spec) if isinstance(element_spec, tuple) else 1
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return
    try:
        signature.bind(*range(count))
    except TypeError:
        names = ", ".join(["features", "label", "sample_weight"][:count]) if count <= 3 else "..."
        structure = (
            f"a tuple of {count} ({names})" if isinstance(element_spec, tuple) else "one value"
        )
        raise TypeError(
            f"{what}={_name(fn)}{signature} cannot be called with this dataset's elements: "
            f"each element is {structure}: {element_spec}, and Dataset.map passes it as "
            f"{count} positional argument(s). Define it as `def {_name(fn)}({names}): ...` "
            f"returning the same structure."
        ) from None


def _map(dataset: tf.data.Dataset, fn: Callable, config: _Config, what: str) -> tf.data.Dataset:
    was_pair = is_pair(dataset.element_spec)
    _check_arity(fn, dataset.element_spec, what)
    mapped = dataset.map(fn, num_parallel_calls=AUTOTUNE, deterministic=config.deterministic)
    if was_pair:
        require_pair(mapped.element_spec, f"the output of {what}={_name(fn)}")
    return mapped


def _resume_note(config: _Config, stateless: bool) -> str:
    """What a resumed training run reproduces exactly (shown by `explain`)."""
    if config.seed is None:
        return (
            "resume: exact only for the data order (restored from the checkpoint's iterator); "
            "without a seed the shuffle and augmentations of a resumed run differ. Pass seed=N "
            "for an exact resume."
        )
    if config.augment is not None and not stateless:
        return (
            f"resume: exact only for the data order: augment={_name(config.augment)} uses "
            "stateful random ops. Give it a seed argument and use tf.random.stateless_* / "
            "tf.image.stateless_random_* ops for bit-exact augmentations on resume."
        )
    if stateless and config.shuffle_buffer is None:
        return (
            "resume: exact when skipped ahead (the Trainer on several replicas); "
            "augmentations from stateless ops seeded by (seed, epoch, element index). "
            "Unshuffled, the epoch key comes from a small reshuffled draw that a restored "
            "iterator checkpoint (the Trainer on one device) may not replay: shuffle, even "
            "with a small buffer, for bit-exact augmentations."
        )
    return (
        "resume: exact (seeded shuffle"
        + (
            "; augmentations from stateless ops seeded by (seed, epoch, element index)"
            if stateless
            else ""
        )
        + ")"
    )


@augment_seeds.own_seed
def _build(config: _Config, context: tf.distribute.InputContext | None):
    pipelines = context.num_input_pipelines if context is not None else 1
    index = context.input_pipeline_id if context is not None else 0
    batch = (
        context.get_per_replica_batch_size(config.batch_size)
        if context is not None
        else config.batch_size
    )
    title = (
        f"tfaccel.data pipeline: {'training' if config.training else 'evaluation'}, "
        f"global batch {config.batch_size} over {config.replicas} replica(s)"
        + (f", per-replica batch {batch}" if context is not None else "")
        + (f", input pipeline {index} of {pipelines}" if pipelines > 1 else "")
    )
    plan = Plan(title)

    self_sharding = not isinstance(config.source, tf.data.Dataset)
    dataset = config.source(context) if self_sharding else config.source
    source = dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"the source function returned {type(dataset).__name__}, not a Dataset.")
    info = source_info(dataset)
    plan.add("source", kind=info.kind if info else "dataset", **(info.details if info else {}))

    if pipelines > 1:
        if self_sharding:
            plan.add(
                "shard", by="source function (input_context)", pipeline=f"{index} of {pipelines}"
            )
        elif info and info.raw is not None and (info.count or 0) >= pipelines:
            dataset = info.finish(info.raw.shard(pipelines, index))
            plan.add("shard", by=info.units, pipeline=f"{index} of {pipelines}", before="decoding")
        else:
            dataset = dataset.shard(pipelines, index)
            plan.add("shard", by="elements", pipeline=f"{index} of {pipelines}")
    if config.training:
        require_pair(dataset.element_spec, "pipeline(training=True)")

    if config.check_finite:
        was_pair = is_pair(dataset.element_spec)
        where = "the source" + (
            f" (input pipeline {index} of {pipelines})" if pipelines > 1 else ""
        )
        dataset = finite.checked(
            dataset, config.preprocess, deterministic=config.deterministic, where=where
        )
        if config.preprocess is not None:
            if was_pair:
                require_pair(
                    dataset.element_spec, f"the output of preprocess={_name(config.preprocess)}"
                )
            plan.add("preprocess", fn=_name(config.preprocess), parallel="AUTOTUNE")
        plan.add(
            "check_finite",
            what="features and labels",
            cost="one is_finite pass per element, before the cache",
        )
    elif config.preprocess is not None:
        dataset = _map(dataset, config.preprocess, config, "preprocess")
        plan.add("preprocess", fn=_name(config.preprocess), parallel="AUTOTUNE")
    uncached = dataset
    if config.cache == "memory":
        dataset = dataset.cache()
        plan.add("cache", to="memory")
    elif config.cache is not None:
        path = config.cache if pipelines == 1 else f"{config.cache}-pipeline{index}of{pipelines}"
        record = cache_lib.record_of(
            str(fingerprint.of_dataset(source)),
            fingerprint.element_spec_text(dataset),
            fingerprint.function_identity(config.preprocess),
        )
        dataset, where = cache_lib.cache_to_file(dataset, path, record, config.cache_mismatch)
        plan.add("cache", to=where)

    stateless = config.augment is not None and augment_seeds.takes_seed(config.augment)
    if stateless:  # indexed here, augmented after the shuffle (see augment_seeds)
        dataset = dataset.enumerate()
    elif config.augment is not None:
        dataset = _map(dataset, config.augment, config, "augment")
        plan.add(
            "augment",
            fn=_name(config.augment),
            parallel="AUTOTUNE",
            after="cache",
            random="stateful",
        )
    if config.training:
        plan.notes.append(_resume_note(config, stateless))

    if config.shuffle_buffer is not None:
        element_bytes = sizing.static_element_bytes(dataset.element_spec)
        if element_bytes is None:  # measure one element, without touching the cache
            unaugmented = config.augment is None or stateless  # stateless: after the shuffle
            sample = uncached if unaugmented else uncached.map(config.augment)
            element_bytes = sizing.measured_element_bytes(sample) or sizing.UNKNOWN_ELEMENT_BYTES
        size, reason = sizing.shuffle_buffer_size(
            config.shuffle_buffer,
            element_bytes=element_bytes,
            cardinality=sizing.known_cardinality(dataset),
            budget_mb=config.shuffle_budget_mb,
        )
        dataset = dataset.shuffle(size, seed=config.seed, reshuffle_each_iteration=True)
        plan.add("shuffle", buffer=size, sizing=reason, seed=config.seed, reshuffle_each_epoch=True)

    if stateless:
        was_pair = is_pair(dataset.element_spec[1])
        dataset = augment_seeds.seeded_augment(
            dataset,
            config.augment,
            seed=augment_seeds.base_seed(config.seed),
            shuffled=config.shuffle_buffer is not None,
            pipelines=pipelines,
            index=index,
            deterministic=config.deterministic,
        )
        if was_pair:
            require_pair(dataset.element_spec, f"the output of augment={_name(config.augment)}")
        plan.add(
            "augment",
            fn=_name(config.augment),
            parallel="AUTOTUNE",
            after="cache and shuffle",
            random="stateless, seeded by (seed, epoch, element index)",
        )

    if config.repeat is True:
        dataset = dataset.repeat()
        plan.add("repeat", times="forever")
    elif config.repeat:
        dataset = dataset.repeat(config.repeat)
        plan.add("repeat", times=config.repeat)

    # Replicas this pipeline feeds: its batches of one step are cut from one batch, so
    # that a partial last batch fills the step (see tfaccel.data.partial).
    pieces = 1
    if context is not None and not config.drop_remainder:
        pieces = max(context.num_replicas_in_sync // max(pipelines, 1), 1)
    dataset = dataset.batch(
        batch * pieces,
        drop_remainder=config.drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=config.deterministic,
    )
    plan.add("batch", size=batch, drop_remainder=config.drop_remainder)
    if pieces > 1:
        dataset = partial.split(dataset, pieces)
        plan.notes.append(
            f"batch: {pieces} replicas' batches are cut from one batch of {batch * pieces}, "
            f"so the partial last batch is shared by the {pieces} replicas of its step"
        )
    if config.batch_map is not None:
        dataset = _map(dataset, config.batch_map, config, "batch_map")
        plan.add("batch_map", fn=_name(config.batch_map), parallel="AUTOTUNE")
    by_element = not self_sharding and (info is None or info.raw is None)
    if pipelines > 1 and config.training and not config.drop_remainder and by_element:
        count = int(source.cardinality()) if info is None or info.count is None else info.count
        empty = partial.shard_padding(count, pipelines, index, batch * pieces) if count >= 0 else 0
        if empty:
            dataset = partial.pad(dataset, empty * pieces)
            plan.add("pad", empty_batches=empty, why="this shard has one batch fewer than others")
    dataset = dataset.prefetch(AUTOTUNE)
    plan.add("prefetch", buffer="AUTOTUNE")

    options = tf.data.Options()
    options.deterministic = config.deterministic
    if context is not None:  # distribute_datasets_from_function: this function shards
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    plan.add("options", deterministic=config.deterministic)
    return dataset, plan
