"""Model FLOPs utilisation for `Throughput`: the model's FLOPs per example and the peak."""

from __future__ import annotations

import tensorflow as tf

PEAK_CALLS = 3  # timed matmul calls for the peak (the fastest counts)


def input_spec(model):
    """The features' `tf.TensorSpec` (a structure of them) from a model's inputs, or None."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    specs = [tf.TensorSpec(tuple(t.shape), t.dtype) for t in inputs]
    return specs[0] if len(specs) == 1 else specs


def flops_per_example(model) -> float | None:
    """Training FLOPs of one example counted from the model's forward graph (3 × forward)."""
    from tfaccel.callbacks.peak import training_flops_per_example  # no import cycle at load

    spec = input_spec(model)
    if spec is None:
        return None
    return training_flops_per_example(model, spec)


PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")  # numpy_function, py_function


def python_ops(model) -> list[str]:
    """Where the model's forward pass runs Python (`numpy_function` / `py_function`): the
    graph's FLOP count leaves their work out. Names without the op's own suffix."""
    spec = input_spec(model)
    if spec is None:
        return []
    example = tf.nest.map_structure(lambda s: tf.zeros((1, *s.shape[1:]), s.dtype), spec)
    try:
        graph = tf.function(lambda: model(example, training=False)).get_concrete_function().graph
    except (ValueError, TypeError, tf.errors.OpError):
        return []
    definition = graph.as_graph_def()
    nodes = list(definition.node)
    for function in definition.library.function:
        nodes.extend(function.node_def)
    names = [
        n.name.rsplit("/", 1)[0] if "/" in n.name else n.name for n in nodes if n.op in PYTHON_OPS
    ]
    return sorted(set(names))


def measured_peak(model) -> tuple[float, str]:
    """(FLOP/s, dtype): this machine's matmul peak in the model's compute dtype."""
    from tfaccel.callbacks.peak import MatmulPeak

    dtype = getattr(getattr(model, "dtype_policy", None), "compute_dtype", None) or "float32"
    n = 2048 if tf.config.list_logical_devices("GPU") else 1024
    return MatmulPeak(n, dtype=dtype).measure(PEAK_CALLS), dtype
