"""Class labels and their loss: what the label methods read, and the loss they compile.

Label smoothing, MixUp and CutMix train on soft targets. Keras' categorical losses take
them (`keras.losses.CategoricalCrossentropy(label_smoothing=..., from_logits=...)`); the
sparse loss does not. So when a label method meets sparse integer labels, the batches'
labels are made one-hot (once, before any mixing) and the loss becomes the categorical
counterpart, keeping `from_logits`. Smoothing is applied once, by the loss, after mixing.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

CLASSIFICATION = ("sparse", "categorical", "binary")
_NAMES = {
    "sparse_categorical_crossentropy": "sparse",
    "categorical_crossentropy": "categorical",
    "binary_crossentropy": "binary",
}
_CLASSES = {
    keras.losses.SparseCategoricalCrossentropy: "sparse",
    keras.losses.CategoricalCrossentropy: "categorical",
    keras.losses.BinaryCrossentropy: "binary",
}


@dataclasses.dataclass(frozen=True)
class LossInfo:
    """What the label methods need of a loss.

    Attributes:
        kind: "sparse", "categorical", "binary" or "other" (regression, custom).
        from_logits: whether the model outputs logits.
        smoothing: the loss's own label smoothing (0 when none).
        name: how the loss was named (for messages).
    """

    kind: str
    from_logits: bool = False
    smoothing: float = 0.0
    name: str = ""


def loss_info(loss) -> LossInfo:
    """Reads the kind, `from_logits` and smoothing of a loss name or `keras.losses.Loss`."""
    if isinstance(loss, str):
        return LossInfo(_NAMES.get(loss, "other"), name=loss)
    for cls, kind in _CLASSES.items():
        if type(loss) is cls:
            config = loss.get_config()
            return LossInfo(
                kind,
                bool(config.get("from_logits", False)),
                float(config.get("label_smoothing", 0.0) or 0.0),
                type(loss).__name__,
            )
    name = getattr(loss, "__name__", None)
    if name in _NAMES and loss is keras.losses.get(name):  # Keras' function (from_logits off)
        return LossInfo(_NAMES[name], name=name)
    return LossInfo("other", name=name or type(loss).__name__)


def classes_of(model: keras.Model) -> int:
    """The number of classes: the size of the model's last output axis."""
    shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    if not shape or shape[-1] is None:
        raise ValueError(
            "The label methods need a model whose output has a known number of classes "
            "(its last axis); build the model (keras.Input) before applying them."
        )
    return int(shape[-1])


def check_class_labels(job, method: str) -> LossInfo:
    """Refuses regression targets and losses the label methods cannot soften.

    Raises:
        ValueError: a regression loss (MSE, MAE, ...), or float labels of one value per
            example (regression targets) with a loss that is not categorical.
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
    if info.kind == "sparse" and spec.dtype.is_floating and spec.shape.rank == 1:
        raise ValueError(
            f"{method} got float labels of shape {tuple(spec.shape)} with a sparse loss: "
            "class ids are integers. Regression targets cannot be mixed as classes; cast "
            "class ids to int32 (labels.astype('int32')) or leave the method out."
        )
    return info


def categorical_loss(info: LossInfo, smoothing: float):
    """The categorical counterpart of a classification loss, with `smoothing`, keeping
    `from_logits` (binary stays binary)."""
    if info.kind == "binary":
        return keras.losses.BinaryCrossentropy(
            from_logits=info.from_logits, label_smoothing=smoothing
        )
    return keras.losses.CategoricalCrossentropy(
        from_logits=info.from_logits, label_smoothing=smoothing
    )


def one_hot_map(classes: int):
    """A batch map making integer labels (shape `(batch,)` or `(batch, 1)`) one-hot."""

    def one_hot(x, y, seed):
        del seed
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        return x, tf.one_hot(y, classes, dtype=tf.float32)

    return one_hot
