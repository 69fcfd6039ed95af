"""`Feed`: the input of one `fit`, `evaluate`, diagnosis or tuner probe, built once.

What the user passed — a batched `tf.data.Dataset`, `tfaccel.data.pipeline`'s
`DatasetFn`, or a function `input_context -> Dataset` — is built once: a dataset
function for this worker's input pipeline, with the context the strategy will pass it.
Every consumer reads that one build: the element spec, the global batch, whether the
batches drop a remainder and how many examples that drops, the length in steps, the
content fingerprint and the plan. The operations they need — repeated, skipped to a
step, reduced to one cached batch, distributed over the replicas — transform the
built dataset; none builds the pipeline again.

Value reads. Iterating any dataset derived from a seeded, reshuffling `shuffle` draws
the shuffle's next seeds (its seed generator is shared by every iterator), so a read
before training would move the training order. The label checks therefore read
`probe`: for a `tfaccel.data` pipeline, its stream before the shuffle, augmented and
batched as in training; for a dataset the user built, the dataset itself (as Keras
reads it). `rebuilt()` gives a second, independent build for timing reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data import graph
from tfaccel.data.assembly.built import built_of, context_key, input_context
from tfaccel.data.assembly.plan import PipelinePlan
from tfaccel.data.fingerprint import Fingerprint

INFINITE = int(tf.data.INFINITE_CARDINALITY)
UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)


def has_static_batch(dataset: tf.data.Dataset) -> bool:
    """True when every batch has the same, static size (`drop_remainder=True`)."""
    dim = tf.nest.flatten(dataset.element_spec)[0].shape
    return bool(dim.rank) and dim[0] is not None


def is_dataset_fn(data: Any) -> bool:
    """True for a `distribute_datasets_from_function`-style callable."""
    return callable(data) and not isinstance(data, tf.data.Dataset)


class _Build:
    """One build of the data: the dataset, its value probe and what the build knew."""

    def __init__(self, data, strategy):
        self.context = input_context(strategy)
        self.function = is_dataset_fn(data)
        self.built = None
        if hasattr(data, "build"):  # tfaccel.data.pipeline's DatasetFn
            self.built = data.build(self.context)
            dataset, probe = self.built.dataset, self.built.probe
        elif self.function:
            dataset = data(self.context)
            if not isinstance(dataset, tf.data.Dataset):
                raise TypeError(
                    f"The dataset function returned a {type(dataset).__name__}, not a "
                    "tf.data.Dataset."
                )
            probe = dataset
        elif isinstance(data, tf.data.Dataset):
            dataset = probe = data
        else:
            raise TypeError(
                f"Expected a batched tf.data.Dataset or a dataset function, got "
                f"{type(data).__name__}. Wrap arrays with tfaccel.data.pipeline(...) or "
                "tf.data.Dataset.from_tensor_slices(...).batch(n)."
            )
        self.dataset, self.probe = dataset, probe
        # Replicas one input pipeline feeds: a step takes that many of its batches.
        self.per_pipeline = max(
            self.context.num_replicas_in_sync // max(self.context.num_input_pipelines, 1), 1
        )


class Feed:
    """The training, validation or evaluation input of one call, built once.

    Args:
        data: a batched `tf.data.Dataset` (global batch), `tfaccel.data.pipeline`'s
            result, or a function `input_context -> Dataset` of per-replica batches.
        strategy: the strategy that reads it.
        what: "training", "validation" or "evaluation" (for messages).

    Raises:
        TypeError: `data` is none of those, or its function returns no dataset.
    """

    def __init__(
        self, data: Any, strategy: tf.distribute.Strategy, *, what: str = "training"
    ) -> None:
        self.data, self.strategy, self.what = data, strategy, what
        self._build = _Build(data, strategy)
        self._transforms: tuple = ()
        self._probe_maps: tuple = ()  # mapped(): what the value checks read, mapped alike
        self._fingerprint: Fingerprint | None = None

    @classmethod
    def of(cls, data: Any, strategy: tf.distribute.Strategy, *, what: str = "training") -> Feed:
        """`data` as a Feed: a Feed (e.g. `Trainer.feed`'s) is reused as it is, once it is
        known to be read by `strategy`; anything else is built once.

        Raises:
            ValueError: a Feed made for another strategy.
        """
        if not isinstance(data, Feed):
            return cls(data, strategy, what=what)
        if data.strategy is not strategy:
            raise ValueError(
                f"This Feed was made for another strategy ({type(data.strategy).__name__}) "
                f"than the one that would read it as {what} data "
                f"({type(strategy).__name__}); make it with this Trainer's feed(...), or "
                "pass the dataset itself."
            )
        return data

    def _derived(self, transform) -> Feed:
        feed = object.__new__(Feed)
        feed.__dict__.update(self.__dict__)
        feed._transforms = (*self._transforms, transform)
        feed._applied = None  # its own transformed dataset, made when first asked for
        return feed

    # -- what every consumer reads -------------------------------------------------------

    @property
    def is_function(self) -> bool:
        """Whether the data is a dataset function (distributed from a function)."""
        return self._build.function

    @property
    def dataset(self) -> tf.data.Dataset:
        """This worker's input pipeline as built, with this feed's transformations (made
        once: a transformation's map function is traced when the dataset is made, 0.3 s
        for the methods' batch maps, and the checks, the build and the loop each ask)."""
        if getattr(self, "_applied", None) is None:
            self._applied = self._apply(self._build.dataset, self._build.context)
        return self._applied

    @property
    def probe(self) -> tf.data.Dataset:
        """Batches for value checks that leave the training order alone (module doc)."""
        probe = self._build.probe
        for fn in self._probe_maps:
            probe = fn(probe)
        return probe

    @property
    def element_spec(self) -> Any:
        """The element spec of the built dataset (per-replica batches of a function)."""
        return self._build.dataset.element_spec

    @property
    def global_batch(self) -> int | None:
        """The batch summed over the replicas of a step, when it can be known."""
        given = getattr(self.data, "global_batch_size", None)
        if given:
            return int(given)
        batch = graph.static_batch_size(self._build.dataset)
        if batch and self.is_function:
            return batch * self._build.per_pipeline * self._build.context.num_input_pipelines
        return batch

    @property
    def drop_remainder(self) -> bool:
        """Whether every batch is full: the pipeline's setting, else the static shape."""
        drop = getattr(self.data, "drop_remainder", None)
        return has_static_batch(self._build.dataset) if drop is None else bool(drop)

    @property
    def steps(self) -> int:
        """Steps of one pass over the data; `INFINITE` (-1) or `UNKNOWN` (-2)."""
        if self._build.built is not None:
            return int(self._build.built.steps)
        count = int(self._build.dataset.cardinality())
        if count < 0 or not self.is_function:
            return count
        return math.ceil(count / self._build.per_pipeline)

    @property
    def dropped(self) -> tuple[int, int] | None:
        """`(dropped, examples)` per epoch by `drop_remainder=True`, or None (none, unknown)."""
        built = self._build.built
        if built is None:
            return graph.dropped_per_epoch(self._build.dataset)
        batch, examples = self.global_batch, built.examples
        if not self.drop_remainder or not examples or not batch or examples % batch == 0:
            return None
        return examples % batch, examples

    @property
    def service(self) -> Any:
        """The tf.data service the pipeline's stages before prefetch run on
        (`service_stage.ServiceInfo`), or None."""
        built = self._build.built or built_of(self._build.dataset)
        return getattr(built, "service", None)

    @property
    def fingerprint(self) -> Fingerprint:
        """The content fingerprint of the whole data (computed once). With several input
        pipelines this worker's build holds its shard only (a source function may shard
        itself), so the fingerprint reads a build of the whole data: every worker must
        compute the one the chief saved."""
        if self._fingerprint is None:
            from tfaccel.data import fingerprint

            whole = self._build.dataset
            if self.is_function and self._build.context.num_input_pipelines > 1:
                whole = self.data(tf.distribute.InputContext())
            self._fingerprint = fingerprint.of_dataset(whole)
        return self._fingerprint

    @property
    def pipelines(self) -> int:
        """Input pipelines reading the data (one a worker)."""
        return int(self._build.context.num_input_pipelines)

    @property
    def order(self) -> str:
        """ "global" when the global batches are the same on any number of input pipelines
        (workers), so that a run resumes exactly on another worker count; else why not."""
        built = self._build.built or built_of(self._build.dataset)
        if built is not None:
            return built.order
        if self.is_function:
            return "a dataset function shards the data itself"
        return "TensorFlow shards a batched tf.data.Dataset across workers itself"

    @property
    def plan(self) -> PipelinePlan:
        """What the pipeline does, stage by stage (`tfaccel.data.explain`)."""
        if self._build.built is not None:
            return self._build.built.plan
        from tfaccel.data.assembly.plan import plan_of

        return plan_of(self._build.dataset)

    def describe_spec(self) -> str:
        """Element dtypes and shapes and the length in steps, in words (run shapes)."""
        spec = tf.nest.map_structure(
            lambda s: f"{s.dtype.name}{s.shape.as_list()[1:] if s.shape.rank else []}",
            self.element_spec,
        )
        length = {INFINITE: "infinite", UNKNOWN: "unknown length"}.get(
            self.steps, f"{self.steps} batches"
        )
        return f"{spec}, {length}"

    # -- operations ----------------------------------------------------------------------

    def repeated(self) -> Feed:
        """The data repeated indefinitely (one stream over all epochs)."""
        return self._derived(lambda ds, context: ds.repeat())

    def symbolic(self) -> Feed:
        """The data with tf.data's symbolic checkpointing: an iterator checkpoint holds
        positions, not buffers. Buffered read-ahead (a `prefetch`, a parallel map) after a
        reshuffling `shuffle`, saved mid-epoch, otherwise restores the shuffle's seeds
        some epochs ahead (TensorFlow 2.21), so every later epoch's order would differ."""
        options = tf.data.Options()
        options.experimental_symbolic_checkpoint = True
        return self._derived(lambda ds, context: ds.with_options(options))

    def symbolic_supported(self) -> bool:
        """Whether no stage (every branch of a zip or concatenate too) is a `cache`, which
        refuses symbolic checkpoints."""
        return not any("Cache" in type(node).__name__ for node in graph.every_input(self.dataset))

    def mapped(self, fn: Callable[[tf.data.Dataset], tf.data.Dataset]) -> Feed:
        """The data with `fn(dataset) -> dataset` applied to its batches (and to the probe,
        so the value checks read what training reads): e.g. `tfaccel.methods`' batch maps.
        The fingerprint stays the source data's."""
        feed = self._derived(lambda ds, context: fn(ds))
        feed._probe_maps = (*self._probe_maps, fn)
        return feed

    def skipped(self, steps: int) -> Feed:
        """The data after `steps` global steps (a resumed run's fast-forward)."""

        def skip(ds, context):
            per_pipeline = context.num_replicas_in_sync // max(context.num_input_pipelines, 1)
            return ds.skip(steps * (per_pipeline if self.is_function else 1))

        return self._derived(skip)

    def one_batch(self) -> Feed:
        """The first batch, cached and repeated (timed passes on the same work)."""
        return self._derived(lambda ds, context: ds.take(1).cache().repeat())

    def rebuilt(self) -> Feed:
        """A second, independent build of the same data (reads that must not draw on this
        one's shuffle seeds, e.g. timing before training); a dataset stays itself."""
        feed = Feed(self.data, self.strategy, what=self.what)
        feed._transforms = self._transforms
        feed._probe_maps = self._probe_maps
        return feed

    def distribute(
        self, endless: bool = False
    ) -> tf.distribute.DistributedDataset | tf.data.Dataset:
        """The dataset to iterate under the strategy. `endless` (repeated) data of a
        function on a multi-worker CPU cluster with one replica per worker is that
        worker's own dataset (see `local_shard`)."""
        if not self.is_function:
            return self.strategy.experimental_distribute_dataset(self.dataset)
        if endless:
            local = local_shard(self.strategy, self._function)
            if local is not None:
                return local
        return self.strategy.distribute_datasets_from_function(self._function)

    def iterator_saveable(self) -> bool:
        """Whether the distributed iterator is a plain `tf.data` iterator, which a
        checkpoint can hold: one strategy-less read of a dataset (not a function)."""
        if self.is_function or isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return False
        return isinstance(
            self.strategy.experimental_distribute_dataset(self.dataset), tf.data.Dataset
        )

    def _function(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if context_key(context) == context_key(self._build.context):
            dataset = self._build.dataset
        else:  # another pipeline than this worker's: not expected, built as asked
            dataset = self.data(context)
        return self._apply(dataset, context)

    def _apply(self, dataset, context):
        for transform in self._transforms:
            dataset = transform(dataset, context)
        return dataset

    def __repr__(self) -> str:
        return (
            f"Feed({self.what}, global_batch={self.global_batch}, steps={self.steps}, "
            f"drop_remainder={self.drop_remainder}, function={self.is_function})"
        )


def local_shard(
    strategy: tf.distribute.Strategy,
    fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
) -> tf.data.Dataset | None:
    """This worker's dataset from `fn`, iterated as it is, when every worker of a
    `MultiWorkerMirroredStrategy` has one replica on its CPU; else None.

    A worker's one replica takes its local batch as it is, so the distributed
    iterator (a multi-device iterator fetching each batch through a function call) adds
    nothing but its cost: about 9 ms of CPU per step here, a third of an MLP step
    (`benchmarks/multi_worker.py`). Only for endless data: without the distributed
    iterator's agreement on the end of data, workers whose shards ended a step apart
    would wait on each other's all-reduce.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    extended = strategy.extended
    workers = getattr(extended, "_num_workers", None)
    index = getattr(extended, "_id_in_cluster", None)
    devices = tuple(getattr(extended, "worker_devices", ()))
    if workers is None or index is None or len(devices) != 1 or "CPU" not in devices[0]:
        return None
    if strategy.num_replicas_in_sync != workers:
        return None
    context = tf.distribute.InputContext(
        num_input_pipelines=workers, input_pipeline_id=index, num_replicas_in_sync=workers
    )
    with tf.device(devices[0]):
        return fn(context)
