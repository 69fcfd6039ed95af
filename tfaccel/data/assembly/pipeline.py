"""`pipeline`: the input pipeline a tf.data expert would write, in a fixed order.

shard (several input pipelines) → preprocess (parallel map) → cache → augment
(training) → shuffle (training, reshuffled each epoch) → repeat → batch →
batch_map (vectorised) → prefetch(AUTOTUNE). Each stage is a function of
`tfaccel.data.assembly.stages`; a build returns what it knows once, as a `Built`.

Example:
    >>> ds = pipeline(from_arrays(x, y), batch_size=64, training=True,
    ...               preprocess=normalize, augment=flip)      # doctest: +SKIP
    >>> print(explain(ds))                                      # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeAlias

import tensorflow as tf

from tfaccel.data.assembly import cache as cache_lib
from tfaccel.data.assembly import sizing, stages
from tfaccel.data.assembly.built import Built, built_of, context_key, input_context, remember  # noqa: F401
from tfaccel.data.assembly.plan import PipelinePlan, attach
from tfaccel.data.contracts.finite import call
from tfaccel.data.elements import on_pairs
from tfaccel.data.order import augment_seeds, global_order, partial
from tfaccel.data.service import stage as service_stage

INFINITE = int(tf.data.INFINITE_CARDINALITY)
UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)

Source: TypeAlias = tf.data.Dataset | Callable[[tf.distribute.InputContext | None], tf.data.Dataset]
_Config = stages.Config


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
        # (context key, Built): pipeline()'s check build, unread
        self._kept: tuple[tuple[int, int, int], Built] | None = None

    @property
    def service(self) -> service_stage.ServiceInfo | None:
        """Where the stages before prefetch run (a tf.data service), or None."""
        return self._config.service

    def __call__(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return self.build(input_context).dataset

    def build(self, input_context: tf.distribute.InputContext | None) -> Built:
        """Builds the dataset of `input_context`'s input pipeline, with what the build
        knows (None: one pipeline of global batches, as without a strategy).

        The build `pipeline()` made to check the input is handed to the first call for
        its context (never read: a fresh build); every later call builds anew.
        """
        kept, self._kept = self._kept, None
        if kept is not None and input_context is not None and context_key(input_context) == kept[0]:
            return kept[1]
        return _build(self._config, input_context)

    def input_context(self) -> tf.distribute.InputContext:
        """The context the strategy passes for this worker's input pipeline."""
        return input_context(self.strategy)

    def distribute(self) -> tf.distribute.DistributedDataset:
        """Returns `strategy.distribute_datasets_from_function(self)`."""
        return self.strategy.distribute_datasets_from_function(self)

    def plan(self) -> PipelinePlan:
        """The plan of input pipeline 0 (what `explain` prints)."""
        workers = int(getattr(self.strategy.extended, "_num_workers", 1) or 1)
        context = tf.distribute.InputContext(
            num_input_pipelines=workers,
            input_pipeline_id=0,
            num_replicas_in_sync=self._config.replicas,
        )
        return _build(self._config, context).plan

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
    service: str | service_stage.LocalService | None = None,
    service_mode: str | None = None,
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
            `tfaccel.data.assembly.cache`): one built from other data is never read.
        shuffle_buffer: "auto" (see `tfaccel.data.assembly.sizing`), a positive int, or
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
        service: run the stages before prefetch on tf.data service workers: an address
            ("grpc://host:port", "host:port") or `tfaccel.data.service.local(n)`; None
            (default) runs everything here. See `tfaccel.data.service.stage`.
        service_mode: "dynamic" (default: `distributed_epoch`, each example once an
            epoch, order not reproducible) or "static" (each worker a fixed shard).

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
    config = _configure(dict(locals()))  # first line: locals() are exactly the arguments
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    replicas = config.replicas
    if replicas > 1 or multi_worker:
        fn = DatasetFn(config, strategy)
        context = fn.input_context()  # this worker's pipeline, built so that bad input
        fn._kept = (context_key(context), _build(config, context))  # fails here; kept for a Feed
        return fn
    built = _build(config, None)
    # Without the dataset itself: a cycle would keep a file cache owned until collected.
    remember(built)
    return built.dataset


def _configure(args: dict) -> stages.Config:
    """`pipeline`'s arguments checked and resolved (the remainder, determinism) into the
    stages' `Config`."""
    strategy, training, seed = args["strategy"], args["training"], args["seed"]
    replicas = int(strategy.num_replicas_in_sync) if strategy is not None else 1
    _check_arguments(args["source"], args["batch_size"], replicas, training, args["augment"])
    sizing.check_request(args["shuffle_buffer"])
    mismatch = args["cache_mismatch"]
    if mismatch not in cache_lib.MISMATCH_MODES:
        raise ValueError(
            f"cache_mismatch must be one of {cache_lib.MISMATCH_MODES}, got {mismatch!r}."
        )
    drop_remainder, deterministic = args["drop_remainder"], args["deterministic"]
    if drop_remainder is None:  # kept unless XLA, or workers' shards that cannot be evened
        multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        uneven = multi_worker and not partial.can_even_shards(args["source"])
        drop_remainder = bool(training and (args["jit_compile"] or uneven))
    if deterministic is None:
        deterministic = seed is not None or not training
    return stages.Config(
        source=args["source"],
        batch_size=args["batch_size"],
        training=bool(training),
        preprocess=args["preprocess"],
        augment=args["augment"],
        cache=cache_lib.check_cache(args["cache"]),
        shuffle_buffer=args["shuffle_buffer"] if training else None,
        shuffle_budget_mb=args["shuffle_budget_mb"],
        seed=stages.check_seed(seed),
        deterministic=deterministic,
        repeat=_checked_repeat(args["repeat"]),
        drop_remainder=bool(drop_remainder),
        batch_map=args["batch_map"],
        replicas=replicas,
        check_finite=bool(args["check_finite"]),
        cache_mismatch=mismatch,
        service=service_stage.info_of(args["service"], args["service_mode"]),
    )


def _check_arguments(source, batch_size, replicas: int, training, augment) -> None:
    """Raises ValueError / TypeError for `pipeline`'s batch, augment and source arguments."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(
            f"batch_size must be a positive int (the global batch), got {batch_size!r}."
        )
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


def _checked_repeat(repeat) -> bool | int:
    """`repeat` as True / False or a positive int; raises ValueError for anything else."""
    if isinstance(repeat, bool) or repeat is None:
        return bool(repeat)
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be True/False or a positive int, got {repeat!r}.")
    return repeat


@augment_seeds.own_seed
def _build(config: stages.Config, context: tf.distribute.InputContext | None) -> Built:
    """Runs the stages in order; returns the dataset (plan attached) and what it knows."""
    stream = stages.start(config, context)
    for stage in stages.stages_for(stream):
        stream = stage(stream)
    return Built(
        dataset=attach(stream.dataset, stream.plan),
        plan=stream.plan,
        steps=UNKNOWN if config.service is not None else _steps(stream),
        examples=_examples(stream),
        make_probe=_probe_of(stream),
        service=config.service,
        order=global_order.order_of(stream),
    )


def _steps(stream: stages.Stream) -> int:
    """Steps of one pass: batches of `batch * pieces`, padding included; per-replica
    batches grouped by the replicas this pipeline feeds when they are not cut from one
    (`drop_remainder=True`: the distributed iterator drops a last step it cannot fill)."""
    count = int(stream.batched.cardinality())
    if count < 0:
        return count
    context = stream.context
    feeds = 1 if context is None else max(context.num_replicas_in_sync // stream.pipelines, 1)
    return (count + stream.padding) // max(feeds // stream.pieces, 1)


def _examples(stream: stages.Stream) -> int | None:
    """Examples of the whole data entering `batch`, or None."""
    if stream.pipelines == 1:
        count = int(stream.before_batch.cardinality())
        return count if count >= 0 else None
    elements = stages.by_element_count(stream)
    times = stream.config.repeat
    if elements is None or elements < 0 or times is True:
        return None
    return elements * (times or 1)


def _probe_of(stream: stages.Stream) -> Callable[[], tf.data.Dataset]:
    """Makes `Built.probe`: per-replica batches of the stream before the cache and the
    shuffle, augmented (a seeded augment with seed (0, 0)) and batch-mapped as in
    training, so labels an augment or a batch_map changes are checked as training sees
    them. It holds nothing after the cache (a cycle would keep a file cache owned)."""
    uncached, config, batch = stream.uncached, stream.config, stream.batch
    stateless, options = stream.stateless, stages.dataset_options(stream)

    def probe() -> tf.data.Dataset:
        dataset = uncached
        if config.augment is not None and stateless:  # as `stages.seeded` calls it
            fn = on_pairs(config.augment, dataset.element_spec, "augment", seed=0)
            zero = tf.zeros([2], tf.int64)
            dataset = dataset.map(lambda *element: call(fn, element, seed=zero))
        elif config.augment is not None:  # as `stages.augment` calls it
            dataset = dataset.map(on_pairs(config.augment, dataset.element_spec, "augment"))
        dataset = dataset.batch(batch, drop_remainder=config.drop_remainder)
        if config.batch_map is not None:
            dataset = dataset.map(on_pairs(config.batch_map, dataset.element_spec, "batch_map"))
        return dataset.with_options(options)

    return probe
