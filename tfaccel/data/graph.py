"""Reading a built `tf.data` pipeline's graph: the one reader of tf.data's private attributes.

tf.data keeps a dataset's input (`_input_dataset`), a batch's size and remainder setting
(`_batch_size`, `_drop_remainder`) and a map's function (`_map_func`) on private Python
attributes, and its serialized graph behind `_as_serialized_graph`. Only this module
reads them (and subclasses tf.data's pass-through dataset, `passed_through`); everything
else in tfaccel calls the functions here, so a TensorFlow release that renames them is
fixed in one place.

Example:
    >>> ds = tf.data.Dataset.range(10).batch(4, drop_remainder=True).prefetch(1)
    >>> static_batch_size(ds), dropped_per_epoch(ds)
    (4, (2, 10))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

CHAIN_LIMIT = 1000  # steps followed back at most (a guard against a cyclic oddity)


@dataclasses.dataclass(frozen=True)
class BatchNode:
    """One batching step of a dataset's input chain.

    Attributes:
        size: its static batch size; None when the size is not a constant.
        drop_remainder: its static `drop_remainder`; None when the step has no such
            setting (e.g. `sparse_batch`), False when it is not a constant.
        parent: the dataset it batches (None if unknown).
        node: the batching dataset itself.
    """

    size: int | None
    drop_remainder: bool | None
    parent: tf.data.Dataset | None
    node: tf.data.Dataset


def input_of(dataset: tf.data.Dataset) -> tf.data.Dataset | None:
    """The dataset `dataset` transforms (its main input), or None for a source."""
    node = getattr(dataset, "_input_dataset", None)
    return node if isinstance(node, tf.data.Dataset) else None


def chain(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """`dataset` and its inputs back to the first of its main input chain, newest first.

    A zip's or concatenate's other branches and an interleave's inner datasets are
    not followed.
    """
    node, seen = dataset, 0
    while isinstance(node, tf.data.Dataset) and seen < CHAIN_LIMIT:
        yield node
        node, seen = input_of(node), seen + 1


def every_input(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """`dataset` and all its input datasets, every branch (an interleave's inner datasets,
    made by its function, are not followed)."""
    stack, seen = [dataset], set[int]()
    while stack and len(seen) < 16 * CHAIN_LIMIT:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, tf.data.Dataset):
            continue
        seen.add(id(node))
        yield node
        stack.extend(node._inputs())


def _static_int(value: Any) -> int | None:
    try:
        return int(tf.get_static_value(value))
    except TypeError:
        return None


def batch_nodes(dataset: tf.data.Dataset) -> Iterator[BatchNode]:
    """The batching steps (`batch`, `padded_batch`, `sparse_batch`...) of the chain,
    newest first."""
    for node in chain(dataset):
        size = getattr(node, "_batch_size", None)
        if size is None:
            continue
        drop = getattr(node, "_drop_remainder", None)
        yield BatchNode(
            size=_static_int(size),
            drop_remainder=None if drop is None else bool(tf.get_static_value(drop)),
            parent=input_of(node),
            node=node,
        )


def batch_node(dataset: tf.data.Dataset) -> BatchNode | None:
    """The newest batching step of `dataset`'s chain, or None when it has none."""
    return next(batch_nodes(dataset), None)


def static_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The batch size `dataset` was batched with: its elements' static leading dimension
    when known (`drop_remainder=True`), else the newest batching step's size; None when
    neither can be read."""
    dim = tf.nest.flatten(dataset.element_spec)[0].shape
    if dim.rank and dim[0] is not None:
        return int(dim[0])
    found = batch_node(dataset)
    return found.size if found is not None else None


def dropped_per_epoch(dataset: tf.data.Dataset) -> tuple[int, int] | None:
    """`(dropped, examples)` per pass of a dataset batched with `drop_remainder=True`.

    Read at the newest batching step with a `drop_remainder` setting: the examples are
    its input's cardinality. None when nothing is dropped or the count cannot be known
    (an unknown or infinite length, e.g. `repeat` before `batch`).
    """
    found = next((b for b in batch_nodes(dataset) if b.drop_remainder is not None), None)
    if found is None or not found.drop_remainder or found.parent is None:
        return None
    examples = int(found.parent.cardinality())
    batch = found.size
    if batch is None or examples < 0 or batch <= 0 or examples % batch == 0:
        return None
    return examples % batch, examples


def batched_by(dataset: tf.data.Dataset) -> int | None:
    """The size of the newest batching step in the chain (`batch`, `padded_batch`,
    `map_and_batch`...): -1 when it cannot be read; None for no batching, or batching
    undone by an `unbatch` after it."""
    for node in chain(dataset):
        if type(node).__name__ == "_UnbatchDataset":
            return None  # batched upstream, unbatched again
        size = getattr(node, "_batch_size", None)
        if size is not None or "Batch" in type(node).__name__:
            found = None if size is None else _static_int(size)
            return -1 if found is None else found
    return None


def map_function_graphs(dataset: tf.data.Dataset) -> Iterator[graph_pb2.GraphDef]:
    """The graph of each map-like step's function along the chain, newest first."""
    for node in chain(dataset):
        function = getattr(getattr(node, "_map_func", None), "function", None)
        graph = getattr(function, "graph", None)
        if graph is not None:
            yield graph.as_graph_def()


def serialized_graph(dataset: tf.data.Dataset, external_state_policy: Any) -> graph_pb2.GraphDef:
    """The whole dataset graph as TensorFlow serializes it (`_as_serialized_graph`)."""
    serialized = dataset._as_serialized_graph(external_state_policy=external_state_policy)
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


def sliced_rows(dataset: tf.data.Dataset) -> Any:
    """The tensors a `Dataset.from_tensor_slices` source slices (its element structure,
    each with a leading row axis), or None for any other dataset: what can be read by
    row index."""
    if type(dataset).__name__ != "_TensorSliceDataset":
        return None
    tensors = getattr(dataset, "_tensors", None)
    if tensors is None:
        return None
    return tf.nest.pack_sequence_as(dataset.element_spec, list(tensors))


_PASS_THROUGH: list = []


def passed_through(
    dataset: tf.data.Dataset, on_iter: Callable[[Iterator], Iterator]
) -> tf.data.Dataset:
    """`dataset` unchanged (the same graph: elements, order, options), except that its
    eager `iter(...)` returns `on_iter(iterator)` (`data.freed_in_background`)."""
    if not _PASS_THROUGH:
        from tensorflow.python.data.ops import dataset_ops

        class PassedThrough(dataset_ops.UnaryUnchangedStructureDataset):
            def __init__(self, input_dataset, on_iter):
                self._input_dataset, self.on_iter = input_dataset, on_iter
                super().__init__(input_dataset, input_dataset._variant_tensor)

            def __iter__(self):
                return self.on_iter(super().__iter__())

        _PASS_THROUGH.append(PassedThrough)
    return _PASS_THROUGH[0](dataset, on_iter)


def passed_through_with(dataset: tf.data.Dataset) -> Callable[[Iterator], Iterator] | None:
    """The `on_iter` of a `passed_through` dataset, else None."""
    return dataset.on_iter if _PASS_THROUGH and isinstance(dataset, _PASS_THROUGH[0]) else None
