"""The label methods' checks of a job, before step 1: a classifier's loss, one label
tensor, and class ids that fit the model's outputs (`labels` holds the losses and maps)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfaccel.data.contracts import label_contract
from tfaccel.methods.base import Job
from tfaccel.methods.labels import LossInfo, soft_target_loss


def output_of(job: Job) -> tuple:
    """The model's output shape, batch first, with a known number of classes (last axis)."""
    shape = label_contract.output_shape(job.model, job.feature_spec)
    if not shape or shape[-1] is None:
        raise ValueError(
            "The label methods need a model with one output whose number of classes (its "
            "last axis) is known; build the model (keras.Input) before applying them."
        )
    return shape


def check_class_labels(job: Job, method: str) -> LossInfo:
    """Refuses regression targets, losses the label methods cannot soften, and labels
    they would mix wrong.

    Raises:
        ValueError: a regression loss (MSE, MAE, ...); float labels of one value per
            example (regression targets) with a sparse loss; several label tensors;
            sparse labels that are not one class id per output position; a setting of
            the loss the soft-target loss cannot keep (e.g. `ignore_class`).
        TypeError: a custom loss function (its soft-target form is unknown).
    """
    info = job.loss_info
    if info.kind == "other":
        keras_own = getattr(job.loss, "__module__", "").startswith("keras")
        if isinstance(job.loss, (str, keras.losses.Loss)) or keras_own:
            raise ValueError(
                f"{method} mixes or softens class labels, but the loss is {info.name!r}, a "
                "regression loss: soft class targets mean nothing to it. Leave "
                f"{method} out for regression, or train a classifier with "
                "'sparse_categorical_crossentropy' / 'categorical_crossentropy'."
            )
        raise TypeError(
            f"{method} needs a Keras crossentropy loss (a name or keras.losses object), got "
            f"{info.name!r}: its form for soft targets is unknown."
        )
    spec = job.label_spec
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        raise ValueError(
            f"{method} mixes one label tensor of known rank per batch, got labels {spec}. "
            f"Leave {method} out for models with several outputs."
        )
    if info.kind == "sparse":
        if spec.dtype.is_floating and spec.shape.rank == 1:
            raise ValueError(
                f"{method} got float labels of shape {tuple(spec.shape)} with a sparse loss: "
                "class ids are integers. Regression targets cannot be mixed as classes; cast "
                "class ids to int32 (labels.astype('int32')) or leave the method out."
            )
        _check_class_ids(spec.shape, output_of(job), method, info.name)
    soft_target_loss(job.loss, 0.0, method)  # refuses a setting it cannot keep
    return info


def _check_class_ids(label: tf.TensorShape, output: tuple, method: str, loss: str) -> None:
    """Sparse labels hold one class id per output position: `output[:-1]`, or that with
    a trailing 1 (what `one_hot_map` turns into `output`'s shape)."""
    ids = tuple(label.as_list())
    if len(ids) == len(output) and ids[-1] in (1, None):
        ids = ids[:-1]
    fits = len(ids) == len(output) - 1 and all(
        a is None or b is None or a == b for a, b in zip(ids[1:], output[1:-1], strict=True)
    )
    if not fits:
        want = ("B", *output[1:-1])
        raise ValueError(
            f"{method} turns the class ids of the loss {loss!r} into one-hot targets of the "
            f"model's output shape {('B', *output[1:])}, so it needs one class id per output "
            f"position, labels of shape {want}; got {('B', *ids[1:])}. Make the labels fit "
            "the outputs, or leave the method out."
        )
