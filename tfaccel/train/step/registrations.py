"""Gradient registrations a trace leaves behind, dropped when the trace ends.

In a `tf.function`, each `tf.custom_gradient` call registers its gradient function in
TensorFlow's process-wide gradient registry under a new name ("CustomGradient-<n>"), and
nothing ever removes it. `ReplicaContext.all_reduce` is such a call (the global batch of a
partial batch, Keras' optimizer summing the gradients), so every trace of a step loop left
an entry holding the traced graph and, through its captures, the model's variables: a new
Trainer (or model) per `fit` in one process kept every earlier one's weights and graphs.

The loops take their gradients inside the trace, so once it ends nothing looks these
entries up again; `dropped_after_trace` removes the ones made in the graph being traced.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.framework import ops

_PREFIX = "CustomGradient-"


def _registry() -> dict | None:
    """TensorFlow's gradient registry (op type name -> entry), or None if it moved."""
    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    return registry if isinstance(registry, dict) else None


def _graphs_of(fn, depth: int = 3):
    """The graphs of the tensors a registered gradient function's closures hold."""
    if depth < 0:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            graph = getattr(item, "graph", None)
            if graph is not None and not isinstance(item, types.FunctionType):
                yield graph
            elif isinstance(item, types.FunctionType):
                yield from _graphs_of(item, depth - 1)


def _inside(graph, outer) -> bool:
    """Whether `graph` is `outer` or a graph nested in it (a loop body, a branch)."""
    while graph is not None:
        if graph is outer:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def made_in(entry: dict[str, Any], graph: tf.Graph) -> bool:
    """Whether a registry entry's gradient function belongs to `graph` (or a graph in it)."""
    return any(_inside(g, graph) for g in _graphs_of(entry.get("type")))


@contextlib.contextmanager
def dropped_after_trace() -> Iterator[None]:
    """Around a traced function's Python body: the custom-gradient registrations made in
    the graph being traced (and the graphs in it) are removed when the body returns."""
    registry = _registry()
    graph = ops.get_default_graph()
    before = set(registry) if registry is not None else set()
    try:
        yield
    finally:
        if registry is not None and getattr(graph, "building_function", False):
            for key in [k for k in list(registry) if k.startswith(_PREFIX) and k not in before]:
                entry = registry.get(key)
                if entry is not None and made_in(entry, graph):
                    registry.pop(key, None)


def count() -> int:
    """Custom-gradient entries in TensorFlow's gradient registry (for tests)."""
    registry = _registry() or {}
    return sum(1 for key in list(registry) if key.startswith(_PREFIX))
