"""The job's kind ("image", "sequence", "tabular"), read from the model, else its inputs.

"fast" holds one stack per kind (`composition.FAST`). The kind is read from the model's
layers (recursively, through nested models and layers that hold layers): recurrences and
attention make a "sequence" job, convolutions an "image" job; a model of none of them (or
no model) falls back on the features' rank. `read_kind` also says, for the settings table,
when the model is of a kind no stack was measured on (a 1-D convnet), or which choice job
measured the stack on it (an attention model).

Example:
    >>> kind_of(model.inputs[0], model)      # doctest: +SKIP
    'image'
"""

from __future__ import annotations

from typing import Any

import keras

KINDS = ("image", "sequence", "tabular")
"""The job kinds "fast" holds a stack for."""

_RECURRENT = (keras.layers.RNN, keras.layers.Bidirectional)
_ATTENTION = (
    keras.layers.MultiHeadAttention,
    keras.layers.GroupQueryAttention,
    keras.layers.Attention,
    keras.layers.AdditiveAttention,
)
_CONV_1D = (
    keras.layers.Conv1D,
    keras.layers.SeparableConv1D,
    keras.layers.DepthwiseConv1D,
    keras.layers.Conv1DTranspose,
)
_CONV = (
    *_CONV_1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.SeparableConv2D,
    keras.layers.DepthwiseConv2D,
    keras.layers.Conv2DTranspose,
    keras.layers.Conv3DTranspose,
)
# What the settings table says when the model decided a kind whose stack was measured on
# other models (the stacks' jobs: benchmarks/time_to_accuracy.py, FAST_CARD).
_CAVEATS = {
    "conv1d": (
        "read from the model: 1-D convolutions, so the convolutional (image) stack; no "
        "stack was measured on 1-D convnets (the image stack on 2-D convnets, the sequence "
        "stack on GRUs)"
    ),
    "attention": (
        "read from the model: attention, so the sequence stack (chosen on GRUs, and measured "
        "best on an attention encoder too: the choice job cifar_shaped_attention, "
        "benchmarks/results/attention_stacks.json)"
    ),
}


def layers_of(model: Any) -> list[Any]:
    """Every layer of `model`, itself included, recursively (nested models, wrappers,
    custom layers holding layers)."""
    seen: dict[int, Any] = {}
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen or not isinstance(layer, keras.layers.Layer):
            continue
        seen[id(layer)] = layer
        flatten = getattr(layer, "_flatten_layers", None)  # Keras' own tracking
        inner = list(flatten(include_self=False, recursive=False)) if flatten else []
        for name in ("layers", "layer", "forward_layer", "backward_layer", "cell"):
            held = getattr(layer, name, None)
            inner += held if isinstance(held, list) else [held]
        stack += [item for item in inner if item is not None]
    return list(seen.values())


def _from_model(model: Any) -> tuple[str | None, str | None]:
    """(kind, caveat) from the layers; (None, None) when they decide nothing."""
    if model is None:
        return None, None
    layers = layers_of(model)
    if any(isinstance(layer, _RECURRENT) for layer in layers):
        return "sequence", None
    if any(isinstance(layer, _ATTENTION) for layer in layers):
        return "sequence", "attention"
    convs = [layer for layer in layers if isinstance(layer, _CONV)]
    if convs:
        flat = all(isinstance(layer, _CONV_1D) for layer in convs)
        return "image", "conv1d" if flat else None
    return None, None


def attention_model(model: Any) -> bool:
    """Whether the model's kind was read from attention (no recurrence in it): "fast"
    warms such a long sequence job up over a quarter of its first epoch."""
    return _from_model(model)[1] == "attention"


def _from_rank(element_spec: Any) -> str:
    spec = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    rank = getattr(getattr(spec, "shape", None), "rank", None)
    kinds: dict[int | None, str] = {4: "image", 3: "sequence"}
    return kinds.get(rank, "tabular")


def kind_of(element_spec: Any, model: Any = None) -> str:
    """The job's kind: "image", "sequence" or "tabular".

    The rule, first match wins, over the model's layers (nested models included):

    1. a recurrence (`RNN`, `GRU`, `LSTM`, `ConvLSTM*`, `Bidirectional`): "sequence";
    2. attention (`MultiHeadAttention`, `GroupQueryAttention`, `Attention`,
       `AdditiveAttention`): "sequence";
    3. a convolution (`Conv1D`/`2D`/`3D`, separable, depthwise, transposed): "image" — a
       1-D convnet included: a convnet is not a GRU job (no stack was measured on 1-D
       convnets; `read_kind` says so in the settings table);
    4. otherwise (a dense model, or no model) the features' rank: 4 "image", 3
       "sequence", else "tabular".

    Args:
        element_spec: the batched dataset's element spec `(x, y[, w])`, or the features'
            spec.
        model: the Keras model (None: the rank alone decides).
    """
    return _from_model(model)[0] or _from_rank(element_spec)


def read_kind(element_spec: Any, model: Any, kind: str | None = None) -> tuple[str, str]:
    """`(kind, note)`: the kind given, else `kind_of`'s; the note ("" or "; ...") says
    for the settings table when no stack was measured on the model's kind."""
    if kind is not None:
        return kind, ""
    found, caveat = _from_model(model)
    if found is None:
        return _from_rank(element_spec), ""
    return found, f"; {_CAVEATS[caveat]}" if caveat else ""
