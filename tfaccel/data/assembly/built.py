"""What one build of a pipeline knows (`Built`), how its dataset carries it, and which
input context (input pipelines, this pipeline's id, replicas) asks for a build."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from tfaccel.data.assembly.plan import PipelinePlan
from tfaccel.data.service.stage import ServiceInfo

_BUILT_ATTR = "_tfaccel_built"


@dataclasses.dataclass(frozen=True)
class Built:
    """One build of a pipeline for one input pipeline, and what the build knows.

    Attributes:
        dataset: the dataset (`DatasetFn.__call__`'s result, plan attached).
        plan: its plan.
        steps: batches of one pass of this input pipeline as the distributed iterator
            steps through them: the batched dataset's cardinality before the split over
            replicas (batches of `batch * pieces`), padding included (with
            `drop_remainder=True` on several replicas: its per-replica batches // the
            replicas it feeds, full steps only); `tf.data.INFINITE_CARDINALITY` (-1)
            when repeated for ever, `tf.data.UNKNOWN_CARDINALITY` (-2) when unknown.
        examples: examples of the whole data entering `batch`, over all input pipelines
            (one pipeline: the cardinality right before `batch`; several: the source's
            element count that the padding evens, times a finite `repeat`); None when
            unknown or infinite.
        probe: per-replica batches of the stream before the cache and the shuffle,
            augmented and batch-mapped as in training (made when first asked for), for
            value checks such as the labels': reading it does not advance the shuffle's
            seed generator, so the training order stays.
        service: where the stages before prefetch run (`ServiceInfo`), or None.
        order: "global" when the global batches are the same on any number of input
            pipelines (workers; `global_order`), else why they are not.
    """

    dataset: tf.data.Dataset
    plan: PipelinePlan
    steps: int
    examples: int | None
    make_probe: Callable[[], tf.data.Dataset]
    service: ServiceInfo | None = None
    order: str = "global"

    @property
    def probe(self) -> tf.data.Dataset:
        """See the class docstring (a new dataset each time it is asked for)."""
        return self.make_probe()


def remember(built: Built) -> None:
    """Attaches `built` (less its dataset) to its dataset, for `built_of` to find."""
    setattr(built.dataset, _BUILT_ATTR, dataclasses.replace(built, dataset=None))


def built_of(dataset: tf.data.Dataset) -> Built | None:
    """The `Built` of a one-replica `pipeline(...)` result (the same dataset), or None for
    any other dataset (a `DatasetFn` builds one per call of `DatasetFn.build`)."""
    known = getattr(dataset, _BUILT_ATTR, None)
    return None if known is None else dataclasses.replace(known, dataset=dataset)


def input_context(strategy: tf.distribute.Strategy) -> tf.distribute.InputContext:
    """The context `strategy` passes to this worker's dataset function."""
    extended = strategy.extended
    workers = int(getattr(extended, "_num_workers", 1) or 1)
    index = int(getattr(extended, "_id_in_cluster", 0) or 0) if workers > 1 else 0
    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=index,
        num_replicas_in_sync=strategy.num_replicas_in_sync,
    )


def context_key(context: tf.distribute.InputContext) -> tuple[int, int, int]:
    """`(input pipelines, this pipeline's id, replicas)`: which build a context asks for."""
    return (
        context.num_input_pipelines,
        context.input_pipeline_id,
        context.num_replicas_in_sync,
    )
