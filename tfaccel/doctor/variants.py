"""A pipeline with one input fix applied, made from its own graph, to time the fix.

The doctor predicts an input fix by measuring its mechanism: the user's pipeline is
serialized (`Dataset._as_serialized_graph`), the graph is changed the way the fix
would change the code, and the changed graph is read back as a dataset in this
process (its Python functions — generators, `py_function`s — are still registered
here). Two rewrites:

- `parallel_maps`: every `map` that runs on one core becomes a parallel map with
  `num_parallel_calls=AUTOTUNE` (what the fix's code does);
- `parallel_source`: a `Dataset.from_generator` read one element at a time becomes
  `shards` copies of it interleaved in parallel (what `data.from_generator(fn,
  shards=N)` does; the copies each yield the whole data, which does not change the
  rate per batch).

A graph that cannot be rewritten (an unknown op version) gives None: not measured.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import tensor_util

_KEEP = tf.data.experimental.ExternalStatePolicy.IGNORE


def parallel_maps(dataset: tf.data.Dataset) -> tf.data.Dataset | None:
    """`dataset` with each sequential `MapDataset` run with AUTOTUNE parallel calls."""
    graph = _graph(dataset)
    changed = False
    for node in list(graph.node):
        if node.op != "MapDataset":
            continue
        calls = _const(graph, f"{node.name}/tfaccel_calls", -1)
        node.op = "ParallelMapDatasetV2"
        node.input.append(calls)
        node.attr.pop("force_synchronous", None)
        node.attr["deterministic"].s = b"default"
        changed = True
    return _dataset(graph, dataset) if changed else None


def parallel_source(dataset: tf.data.Dataset, shards: int) -> tf.data.Dataset | None:
    """`dataset` with its sequential generator source read as `shards` in parallel."""
    graph = _graph(dataset)
    for node in list(graph.node):
        if node.op != "FlatMapDataset" or not _makes_generator(graph, node):
            continue
        source, *captured = node.input
        count = _const(graph, f"{node.name}/tfaccel_shards", shards)
        repeated = graph.node.add()
        repeated.name = f"{node.name}/tfaccel_repeat"
        repeated.op = "RepeatDataset"
        repeated.input.extend([source, count])
        producer = _producer(graph, source).attr  # a TensorDataset names it Toutput_types
        types = (
            producer["output_types"] if "output_types" in producer else producer["Toutput_types"]
        )
        repeated.attr["output_types"].CopyFrom(types)
        repeated.attr["output_shapes"].CopyFrom(producer["output_shapes"])
        node.op = "ParallelInterleaveDatasetV4"
        del node.input[:]
        node.input.extend(
            [
                repeated.name,
                *captured,
                count,  # cycle_length
                _const(graph, f"{node.name}/tfaccel_block", 1),
                _const(graph, f"{node.name}/tfaccel_buffer", -1),
                _const(graph, f"{node.name}/tfaccel_prefetch", -1),
                count,  # num_parallel_calls
            ]
        )
        node.attr["deterministic"].s = b"default"
        return _dataset(graph, dataset)
    return None


def _graph(dataset: tf.data.Dataset) -> graph_pb2.GraphDef:
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph(external_state_policy=_KEEP).numpy())
    return graph


def _dataset(graph: graph_pb2.GraphDef, like: tf.data.Dataset) -> tf.data.Dataset | None:
    try:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
        return dataset_ops._VariantDataset(variant, like.element_spec)
    except (tf.errors.OpError, ValueError, TypeError):
        return None


def _const(graph: graph_pb2.GraphDef, name: str, value: int) -> str:
    node = graph.node.add()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = tf.int64.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(np.int64(value)))
    return name


def _producer(graph: graph_pb2.GraphDef, name: str) -> node_def_pb2.NodeDef:
    return next(n for n in graph.node if n.name == name.split(":")[0])


def _makes_generator(graph: graph_pb2.GraphDef, node: node_def_pb2.NodeDef) -> bool:
    name = node.attr["f"].func.name
    function = next((f for f in graph.library.function if f.signature.name == name), None)
    return function is not None and any(n.op == "GeneratorDataset" for n in function.node_def)
