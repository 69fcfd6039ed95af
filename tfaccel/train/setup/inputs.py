"""Checks of the Trainer's input: element structure, feature shapes, length.

The input itself — built once, distributed, repeated, skipped — is a `tfaccel.data.Feed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfaccel.data.assembly.feed import Feed, has_static_batch
from tfaccel.train.setup import model_steps

INFINITE = tf.data.INFINITE_CARDINALITY


def check_elements(spec: Any, model: keras.Model) -> None:
    """Raises ValueError unless elements (`spec`) are batched `(x, y)` or `(x, y, weight)`."""
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            "Each dataset element must be a tuple (x, y) or (x, y, sample_weight); got "
            f"element_spec {spec}. Map it first, e.g. ds.map(lambda d: (d['image'], d['label']))."
        )
    flat = tf.nest.flatten(spec)
    unbatched = any(s.shape.rank == 0 for s in flat)
    inputs = getattr(model, "inputs", None)
    if not unbatched and inputs:
        x_specs = tf.nest.flatten(spec[0])
        if len(x_specs) == len(inputs):
            unbatched = any(
                s.shape.rank is not None and s.shape.rank == len(i.shape) - 1
                for s, i in zip(x_specs, inputs, strict=True)
            )
    if unbatched:
        raise ValueError(
            f"The dataset looks unbatched (element_spec {spec}): elements need a leading batch "
            "dimension. Call .batch(global_batch_size) on it, or build it with "
            "tfaccel.data.pipeline(..., batch_size=...)."
        )
    _check_features(spec[0], model)
    _check_input_names(spec[0], model)
    if len(spec) == 3:
        _check_weight_spec(spec[1], spec[2])


def _check_input_names(x_spec: Any, model: keras.Model) -> None:
    """Raises when dict features miss an input the model names (e.g. a misspelt key)."""
    from keras.src.models.functional import Functional

    if not isinstance(x_spec, dict) or not isinstance(model, Functional):
        return
    names = []  # as Keras matches a dict of features: by the input layers' names
    for tensor in model.inputs or []:
        operation = getattr(getattr(tensor, "_keras_history", None), "operation", None)
        names.append(getattr(operation, "name", None))
    missing = [n for n in names if n and n not in x_spec]
    if names and missing:
        raise ValueError(
            f"The features are a dict with keys {sorted(x_spec)}, but the model's inputs are "
            f"named {names}: no feature for {missing}. Name the dict's keys after the "
            "model's inputs (keras.Input(name=...))."
        )


def _check_weight_spec(label_spec: Any, weight_spec: Any) -> None:
    """Raises when sample weights are not one per example (or one per label element)."""
    if not isinstance(weight_spec, tf.TensorSpec) or not isinstance(label_spec, tf.TensorSpec):
        return
    weight, label = weight_spec.shape, label_spec.shape
    if weight.rank is None or label.rank is None:
        return
    if weight.rank == 0:
        return  # unbatched: check_elements says so
    per_example = weight.rank == 1 or (weight.rank == 2 and weight[-1] in (1, None))
    if per_example or weight.is_compatible_with(label):
        return
    raise ValueError(
        f"The sample weights have shape {_shape(weight.as_list())}, but labels of shape "
        f"{_shape(label.as_list())} take one weight per example (shape (batch,)) or one per "
        "label element (the labels' shape). Reduce or reshape the weights in the pipeline."
    )


def _check_features(x_spec: Any, model: keras.Model) -> None:
    """Raises when the features cannot feed the model's (known) inputs."""
    flat = [s for s in tf.nest.flatten(x_spec) if isinstance(s, tf.TensorSpec)]
    inputs = list(getattr(model, "inputs", None) or [])
    wants_strings = any(str(getattr(i, "dtype", "")) == "string" for i in inputs)
    strings = [s for s in flat if s.dtype == tf.string]
    if strings and inputs and not wants_strings:
        raise TypeError(
            f"The features hold strings ({strings[0]}), but the model computes on numbers. "
            "Turn text into numbers in the input pipeline (e.g. a keras.layers.StringLookup "
            "or TextVectorization in preprocess=), or start the model with such a layer on a "
            "keras.Input(dtype='string')."
        )
    if len(inputs) != 1 or len(flat) != 1 or flat[0].shape.rank is None:
        return  # several inputs: Keras matches them by name when it calls the model
    want, have = tuple(inputs[0].shape), tuple(flat[0].shape.as_list())
    if len(have) == len(want) + 1 and have[-1] in (1, None):
        have_cmp = have[:-1]  # Keras squeezes a trailing axis of size 1
    else:
        have_cmp = have
    compatible = len(want) == len(have_cmp) and all(
        w is None or h is None or w == h for w, h in zip(want[1:], have_cmp[1:], strict=True)
    )
    if not compatible:
        raise ValueError(
            f"The model expects input of shape {_shape(want)} (batch first), but the data's "
            f"features have shape {_shape(have)}. Reshape the features in the input "
            "pipeline (preprocess=) or build the model with "
            f"keras.Input(shape={_shape(have[1:])})."
        )


def _shape(dims: Sequence[int | None]) -> str:
    return (
        "("
        + ", ".join("None" if d is None else str(d) for d in dims)
        + ("," if len(dims) == 1 else "")
        + ")"
    )


def check_not_empty(feed: Feed, what: str) -> None:
    """Raises ValueError for data that is known to hold no batch."""
    if feed.steps == 0:
        raise ValueError(
            f"The {what} dataset is empty (0 batches), so there is nothing to "
            f"{'train on' if what == 'training' else 'evaluate'}. Check the source (files, "
            "filters, take/skip) and that drop_remainder=True did not drop the only partial "
            "batch."
        )


def check_finite(feed: Feed, steps_per_epoch: int | None, what: str) -> None:
    """Raises ValueError for infinite data without a step count."""
    if steps_per_epoch is None and feed.steps == INFINITE:
        raise ValueError(
            f"The {what} dataset is infinite (it repeats), so an epoch never ends on its own. "
            f"Pass {'steps_per_epoch' if what == 'training' else 'validation_steps'}=N, or "
            "remove .repeat()."
        )


def check_feed(feed: Feed, model: keras.Model, steps: int | None, what: str, replicas: int) -> None:
    """`fit`'s checks of one input (`Trainer.feed`): elements (not for a model running
    its own steps, which take any structure: `model_steps`), emptiness, length, batch."""
    if not model_steps.overridden(model):
        check_elements(feed.element_spec, model)
    check_not_empty(feed, what)
    check_finite(feed, steps, what)
    check_divides(feed, replicas)


def check_divides(feed: Feed, replicas: int) -> None:
    """Raises when a static global batch (drop_remainder=True) does not divide among replicas."""
    batch = feed.global_batch
    if feed.is_function or not batch or not has_static_batch(feed.dataset):
        return
    if batch % replicas:
        raise ValueError(
            f"The global batch of {batch} (drop_remainder=True) does not divide among "
            f"{replicas} replicas. Use a batch size that is a multiple of {replicas}."
        )
