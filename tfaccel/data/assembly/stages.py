"""The stages of `tfaccel.data.pipeline`, one small function each, called in order.

Each stage takes the `Stream` (the dataset so far, its plan and what the build has
learnt) and returns it with its own step applied: source and shard → preprocess (and
`check_finite`) → cache → augment (stateful) → shuffle → augment (seeded) → repeat →
batch (split over replicas) → batch_map → pad → prefetch and options.

Elements are `(features, label)` pairs, bare features, or `(features, label,
sample_weight)` triples: for a triple, a user function that takes the pair gets the pair
and the weight rides beside it (`elements.on_pairs`).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data import fingerprint, graph
from tfaccel.data.assembly import cache as cache_lib
from tfaccel.data.assembly import sizing
from tfaccel.data.assembly.plan import PipelinePlan
from tfaccel.data.contracts import finite
from tfaccel.data.elements import AUTOTUNE, is_pair, is_weighted, name, on_pairs, require_pair
from tfaccel.data.order import augment_seeds, global_order, partial
from tfaccel.data.order.resume_note import resume_note
from tfaccel.data.service import splits as service_splits
from tfaccel.data.service.stage import offload
from tfaccel.data.sources.info import SourceInfo, source_info


@dataclasses.dataclass(frozen=True)
class Config:
    """What `pipeline` was asked for, checked."""

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
    service: Any = None  # a service_stage.ServiceInfo: the stages before prefetch run there


@dataclasses.dataclass
class Stream:
    """One build in progress: the dataset so far and what the stages learnt about it.

    Attributes:
        config: the pipeline's settings.
        context: the input context (None: one pipeline, global batches).
        pipelines, index: input pipelines, and this one's id.
        batch: the batch of one replica (the global batch without a context).
        plan: the plan so far.
        dataset: the dataset so far.
        source: the source dataset (this pipeline's, for a source function).
        info: the source's `SourceInfo`, or None.
        self_sharding: whether the source is a function that shards itself.
        uncached: the stream right before the cache (read by the shuffle's sizing).
        stateless: whether augment takes a seed (augmented after the shuffle).
        pieces: replicas' batches cut from one batch of this pipeline.
        padding: empty batches (of `batch * pieces`) appended to even the shards.
        before_batch: the stream right before `batch`.
        batched: the stream right after `batch`, before `partial.split`.
        elastic: whether this pipeline reads its slice of the global order by index
            (`global_order`): several pipelines whose batches do not depend on their count.
        split_rows: the rows of the source when it was cut into chunks for the service
            (`service_splits`: the chunked stream's cardinality is unknown).
    """

    config: Config
    context: tf.distribute.InputContext | None
    pipelines: int
    index: int
    batch: int
    plan: PipelinePlan
    dataset: tf.data.Dataset = None
    source: tf.data.Dataset = None
    info: SourceInfo | None = None
    self_sharding: bool = False
    uncached: tf.data.Dataset = None
    stateless: bool = False
    pieces: int = 1
    padding: int = 0
    before_batch: tf.data.Dataset = None
    batched: tf.data.Dataset = None
    elastic: bool = False
    split_rows: int | None = None


def check_seed(seed: Any) -> int | None:
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


def check_arity(fn: Callable, element_spec: Any, what: str, **keywords: Any) -> None:
    """Raises TypeError when `fn` cannot take the element's components as arguments.

    `Dataset.map` unpacks a tuple element into positional arguments, so a pair calls
    `fn(features, label)` and anything else calls `fn(element)`; a triple's function
    may also take only the pair (the sample weight then rides beside it).
    """
    count = len(element_spec) if isinstance(element_spec, tuple) else 1
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return
    counts = (count, 2) if is_weighted(element_spec) else (count,)
    for tried in counts:
        try:
            signature.bind(*range(tried), **keywords)
            return
        except TypeError:
            pass
    names = ", ".join(["features", "label", "sample_weight"][:count]) if count <= 3 else "..."
    structure = f"a tuple of {count} ({names})" if isinstance(element_spec, tuple) else "one value"
    raise TypeError(
        f"{what}={name(fn)}{signature} cannot be called with this dataset's elements: "
        f"each element is {structure}: {element_spec}, and Dataset.map passes it as "
        f"{count} positional argument(s). Define it as `def {name(fn)}({names}): ...` "
        f"returning the same structure."
    ) from None


def mapped(dataset: tf.data.Dataset, fn: Callable, config: Config, what: str) -> tf.data.Dataset:
    """`dataset.map(fn)` in parallel, checking that pairs stay pairs (triples, triples)."""
    spec = dataset.element_spec
    check_arity(fn, spec, what)
    where = f"the output of {what}={name(fn)}"
    result = dataset.map(
        on_pairs(fn, spec, where), num_parallel_calls=AUTOTUNE, deterministic=config.deterministic
    )
    if is_pair(spec) or is_weighted(spec):
        require_pair(result.element_spec, where)
    return result


def start(config: Config, context: tf.distribute.InputContext | None) -> Stream:
    """A new stream for one input pipeline, with its plan's title."""
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
    return Stream(config, context, pipelines, index, batch, PipelinePlan(title))


def source_and_shard(s: Stream) -> Stream:
    """The source, and this pipeline's shard of it (by file before decoding if it can)."""
    s.self_sharding = not isinstance(s.config.source, tf.data.Dataset)
    dataset = s.config.source(s.context) if s.self_sharding else s.config.source
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"the source function returned {type(dataset).__name__}, not a Dataset.")
    s.source, info = dataset, source_info(dataset)
    s.info = info
    s.plan.add("source", kind=info.kind if info else "dataset", **(info.details if info else {}))
    where = f"{s.index} of {s.pipelines}"
    if s.pipelines > 1:
        if s.self_sharding:
            s.plan.add("shard", by="source function (input_context)", pipeline=where)
        elif info and info.raw is not None and info.finish and (info.count or 0) >= s.pipelines:
            dataset = info.finish(info.raw.shard(s.pipelines, s.index))
            s.plan.add("shard", by=info.units, pipeline=where, before="decoding")
        else:
            dataset = dataset.shard(s.pipelines, s.index)
            s.plan.add("shard", by="elements", pipeline=where)
    service = s.config.service
    if service is not None and service.mode == "dynamic" and s.pipelines == 1:
        dataset, rows = service_splits.chunked(dataset, service.workers)
        if rows:
            s.split_rows = int(s.source.cardinality())
            s.plan.add("splits", by=f"chunks of {rows} rows (strided)", handed_out="per chunk")
    if s.config.training:
        require_pair(dataset.element_spec, "pipeline(training=True)")
    s.dataset = dataset
    return s


def preprocess(s: Stream) -> Stream:
    """`preprocess` (parallel map), checked for non-finite values when asked."""
    config = s.config
    fn = config.preprocess
    if config.check_finite:
        spec = s.dataset.element_spec
        where = "the source" + (
            f" (input pipeline {s.index} of {s.pipelines})" if s.pipelines > 1 else ""
        )
        output = f"the output of preprocess={name(fn)}" if fn is not None else ""
        s.dataset = finite.checked(
            s.dataset,
            None if fn is None else on_pairs(fn, spec, output),
            deterministic=config.deterministic,
            where=where,
        )
        if fn is not None:
            if is_pair(spec) or is_weighted(spec):
                require_pair(s.dataset.element_spec, output)
            s.plan.add("preprocess", fn=name(fn), parallel="AUTOTUNE")
        s.plan.add(
            "check_finite",
            what="features and labels",
            cost="one is_finite pass per element, before the cache",
        )
    elif fn is not None:
        s.dataset = mapped(s.dataset, fn, config, "preprocess")
        s.plan.add("preprocess", fn=name(fn), parallel="AUTOTUNE")
    s.uncached = s.dataset
    return s


def cache(s: Stream) -> Stream:
    """The cache: in memory, or in files fingerprinted with the data they hold."""
    config = s.config
    if config.cache == "memory":
        s.dataset = s.dataset.cache()
        s.plan.add("cache", to="memory")
    elif config.cache is not None:
        path = config.cache
        if s.pipelines > 1:
            path = f"{config.cache}-pipeline{s.index}of{s.pipelines}"
        record = cache_lib.record_of(
            str(fingerprint.of_dataset(s.source)),
            fingerprint.element_spec_text(s.dataset),
            fingerprint.function_identity(config.preprocess),
        )
        s.dataset, where = cache_lib.cache_to_file(s.dataset, path, record, config.cache_mismatch)
        s.plan.add("cache", to=where)
    return s


def augment(s: Stream) -> Stream:
    """A stateful `augment` after the cache; a seeded one is indexed here (see `seeded`)."""
    config = s.config
    s.stateless = config.augment is not None and augment_seeds.takes_seed(config.augment)
    if s.stateless:  # indexed here, augmented after the shuffle (see augment_seeds)
        s.dataset = s.dataset.enumerate()
    elif config.augment is not None:
        s.dataset = mapped(s.dataset, config.augment, config, "augment")
        s.plan.add(
            "augment",
            fn=name(config.augment),
            parallel="AUTOTUNE",
            after="cache",
            random="stateful",
        )
    if config.training:
        s.plan.notes.append(resume_note(config, s.stateless))
    return s


def shuffle(s: Stream) -> Stream:
    """The shuffle, reshuffled each epoch, its buffer sized to the memory budget."""
    config = s.config
    if config.shuffle_buffer is None:
        return s
    size, reason = shuffle_buffer(s)
    s.dataset = s.dataset.shuffle(size, seed=config.seed, reshuffle_each_iteration=True)
    s.plan.add("shuffle", buffer=size, sizing=reason, seed=config.seed, reshuffle_each_epoch=True)
    return s


def shuffle_buffer(s: Stream) -> tuple[int, str]:
    """The shuffle's buffer for the data so far (`s.dataset`), sized to the memory budget."""
    config = s.config
    element_bytes = sizing.static_element_bytes(s.dataset.element_spec)
    if element_bytes is None:  # measure one element, without touching the cache
        sample = s.uncached
        if config.augment is not None and not s.stateless:  # stateless: after the shuffle
            fn = on_pairs(config.augment, sample.element_spec, "augment")
            sample = sample.map(fn)
        element_bytes = sizing.measured_element_bytes(sample) or sizing.UNKNOWN_ELEMENT_BYTES
    return sizing.shuffle_buffer_size(
        config.shuffle_buffer,
        element_bytes=element_bytes,
        cardinality=sizing.known_cardinality(s.dataset),
        budget_mb=config.shuffle_budget_mb,
    )


def elastic(s: Stream) -> Stream:
    """Several input pipelines over rows in memory: each reads its slice of the global
    order by index, then preprocesses and augments it (see `global_order`)."""
    config = s.config
    s.source, s.info, s.elastic = config.source, source_info(config.source), True
    info = s.info
    s.plan.add("source", kind=info.kind if info else "dataset", **(info.details if info else {}))
    s.plan.add("shard", by="global order (index slices)", pipeline=f"{s.index} of {s.pipelines}")
    require_pair(config.source.element_spec, "pipeline(training=True)")
    s.stateless = config.augment is not None and augment_seeds.takes_seed(config.augment)
    s.dataset = config.source
    if config.preprocess is not None:
        s.dataset = mapped(config.source, config.preprocess, config, "preprocess")
    s.uncached = s.dataset
    if config.cache == "memory":
        s.plan.notes.append("cache: not needed (the rows are in memory and read by index)")
    # The buffer is sized on the elements one pipeline would shuffle (index or augment
    # included), so that both give the same buffer, hence the same permutation.
    if s.stateless:
        s.dataset = s.dataset.enumerate()
    elif config.augment is not None:
        s.dataset = mapped(s.dataset, config.augment, config, "augment")
    s = global_order.read(s, *shuffle_buffer(s))
    s.plan.notes.append(resume_note(config, s.stateless) + "; elastic over workers")
    return s


def seeded(s: Stream) -> Stream:
    """A seeded `augment(features, label, seed)`: stateless ops, seeded per element."""
    config, augment = s.config, s.config.augment
    if not s.stateless or augment is None:  # stateless: augment is given and takes a seed
        return s
    spec = s.dataset.element_spec[1]
    where = f"the output of augment={name(augment)}"
    s.dataset = augment_seeds.seeded_augment(
        s.dataset,
        on_pairs(augment, spec, where, seed=0),
        seed=augment_seeds.base_seed(config.seed),
        shuffled=config.shuffle_buffer is not None,
        pipelines=s.pipelines,
        index=s.index,
        deterministic=config.deterministic,
    )
    if is_pair(spec) or is_weighted(spec):
        require_pair(s.dataset.element_spec, where)
    s.plan.add(
        "augment",
        fn=name(augment),
        parallel="AUTOTUNE",
        after="cache and shuffle",
        random="stateless, seeded by (seed, epoch, element index)",
    )
    return s


def repeat(s: Stream) -> Stream:
    """`repeat`: for ever, or a number of times."""
    times = s.config.repeat
    if times is True:
        s.dataset = s.dataset.repeat()
        s.plan.add("repeat", times="forever")
    elif times:
        s.dataset = s.dataset.repeat(times)
        s.plan.add("repeat", times=times)
    return s


def batch(s: Stream) -> Stream:
    """`batch`: one batch of all this pipeline's replicas, split into their pieces (see
    `tfaccel.data.order.partial`), so that a step holds whole global batches of one epoch (the
    partial last one kept, or dropped) on any number of replicas."""
    config = s.config
    if s.context is not None:
        s.pieces = max(s.context.num_replicas_in_sync // max(s.pipelines, 1), 1)
    s.before_batch = s.dataset
    s.dataset = s.batched = s.dataset.batch(
        s.batch * s.pieces,
        drop_remainder=config.drop_remainder,
        num_parallel_calls=AUTOTUNE,
        deterministic=config.deterministic,
    )
    s.plan.add("batch", size=s.batch, drop_remainder=config.drop_remainder)
    if s.pieces > 1 and config.drop_remainder:
        s.dataset = partial.split_even(s.dataset, s.pieces)
    elif s.pieces > 1:
        s.dataset = partial.split(s.dataset, s.pieces)
        s.plan.notes.append(
            f"batch: {s.pieces} replicas' batches are cut from one batch of "
            f"{s.batch * s.pieces}, so the partial last batch is shared by the {s.pieces} "
            "replicas of its step"
        )
    return s


def batch_map(s: Stream) -> Stream:
    """`batch_map`: a vectorised function of whole batches."""
    fn = s.config.batch_map
    if fn is not None:
        s.dataset = mapped(s.dataset, fn, s.config, "batch_map")
        s.plan.add("batch_map", fn=name(fn), parallel="AUTOTUNE")
    return s


def by_element_count(s: Stream) -> int | None:
    """The source's element count when it is sharded by element over several pipelines
    (what the padding evens), else None."""
    by_element = not s.self_sharding and (s.info is None or s.info.raw is None)
    if s.pipelines == 1 or not by_element:
        return None
    count = s.info.count if s.info is not None and s.info.count is not None else None
    return int(s.source.cardinality()) if count is None else count


def pad(s: Stream) -> Stream:
    """Empty batches that give every pipeline's shard the same number of steps."""
    config = s.config
    count = by_element_count(s)
    if not config.training or config.drop_remainder or count is None or count < 0:
        return s
    if s.elastic:
        s.padding = global_order.padding(s, count)
    else:
        s.padding = partial.shard_padding(count, s.pipelines, s.index, s.batch * s.pieces)
    if s.padding:
        s.dataset = partial.pad(s.dataset, s.padding * s.pieces)
        s.plan.add("pad", empty_batches=s.padding, why="this shard has one batch fewer than others")
    return s


def options(s: Stream) -> Stream:
    """`prefetch(AUTOTUNE)` and the options: determinism, no auto-sharding, no rewrites of
    rows in memory."""
    s.dataset = s.dataset.prefetch(AUTOTUNE)
    s.plan.add("prefetch", buffer="AUTOTUNE")
    s.dataset = s.dataset.with_options(dataset_options(s))
    rewrites = {"rewrites": "off (rows in memory)"} if rows_in_memory(s) else {}
    s.plan.add("options", deterministic=s.config.deterministic, **rewrites)
    return s


def rows_in_memory(s: Stream) -> bool:
    """Whether the source is rows in memory (`from_arrays`): tf.data's static rewrites
    (its default optimizations) would copy them into the rewritten graph, a copy of the
    arrays kept after the run; the stages set their parallelism themselves."""
    return s.elastic or graph.sliced_rows(s.config.source) is not None


def dataset_options(s: Stream) -> tf.data.Options:
    """The options of the pipeline's datasets."""
    result = tf.data.Options()
    result.deterministic = s.config.deterministic
    if s.context is not None:  # distribute_datasets_from_function: this function shards
        result.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if rows_in_memory(s):
        result.experimental_optimization.apply_default_optimizations = False
    return result


STAGES = (
    source_and_shard,
    preprocess,
    cache,
    augment,
    shuffle,
    seeded,
    repeat,
    batch,
    batch_map,
    pad,
    offload,
    options,
)
"""The stages, in the order `pipeline` applies them."""

ELASTIC_STAGES = (elastic, repeat, batch, batch_map, pad, offload, options)
"""The stages of one of several input pipelines reading the global order by index."""


def stages_for(s: Stream) -> tuple:
    """The stages of stream `s`: `ELASTIC_STAGES` when several pipelines can read the
    global order (`global_order.reason_not`), else `STAGES`."""
    if s.pipelines > 1 and global_order.reason_not(s.config) is None:
        return ELASTIC_STAGES
    return STAGES
