"""Cost estimates for pipeline stages: parameters and forward FLOPs per example."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras import tree


def node_params(node: Any, seen: set[int]) -> int:
    """Parameters of the layer a graph node calls, counted at its first node only."""
    operation = node.operation
    if id(operation) in seen or not isinstance(operation, keras.layers.Layer):
        return 0
    seen.add(id(operation))
    return operation.count_params() if operation.built else 0


def graph_flops(graph: tf.Graph) -> int:
    """Float operations in a graph, as TensorFlow's profiler counts them."""
    options = (
        tf.compat.v1.profiler.ProfileOptionBuilder(
            tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        )
        .with_empty_output()
        .build()
    )
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # the v1 profiler logs a deprecation warning
    try:
        return int(tf.compat.v1.profiler.profile(graph, options=options).total_float_ops)
    finally:
        logger.setLevel(level)


def _example_tensor(spec, what: str) -> tf.Tensor:
    shape = tuple(spec.shape)[1:]
    if any(dim is None for dim in shape):
        raise ValueError(
            f"balance='flops' needs static input shapes, but {what} has shape {spec.shape}. "
            "Give the model a fully defined input shape, or use balance='params'."
        )
    return tf.zeros((1, *shape), dtype=spec.dtype)


def node_flops(node: Any) -> int:
    """Estimated forward FLOPs of one graph node for a single example."""
    operation = node.operation
    values = {id(t): _example_tensor(t, operation.name) for t in node.input_tensors}

    def forward():
        args, kwargs = node.arguments.fill_in(values)
        return operation(*args, **kwargs)

    return graph_flops(tf.function(forward).get_concrete_function().graph)


def model_flops(model: keras.Model) -> int:
    """Estimated forward FLOPs of a functional model for a single example."""
    examples = [_example_tensor(t, model.name) for t in tree.flatten(model.inputs)]
    structure = getattr(model, "_inputs_struct", None)
    inputs = tree.pack_sequence_as(structure, examples) if structure is not None else examples

    def forward():
        return model(inputs, training=False)

    return graph_flops(tf.function(forward).get_concrete_function().graph)
