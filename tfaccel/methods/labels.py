"""Class labels and their loss: what the label methods read, and the loss they compile.

Label smoothing, MixUp and CutMix train on soft targets. Keras' categorical and binary
losses take them (`label_smoothing=`); the sparse loss does not. So when a label method
meets sparse integer labels, the batches' labels are made one-hot (once, before any
mixing; `(B,)` -> `(B, C)`, sequences `(B, T)` -> `(B, T, C)`) and the loss becomes the
categorical counterpart. Every setting of the user's loss is kept (reduction,
`from_logits`, axis, name, dtype, ...), or refused with its name. Smoothing is applied
once, by the loss, after mixing.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

if TYPE_CHECKING:
    from tfaccel.methods.batch_maps import MapFn

CLASSIFICATION = ("sparse", "categorical", "binary")
_CLASSES = {
    keras.losses.SparseCategoricalCrossentropy: "sparse",
    keras.losses.CategoricalCrossentropy: "categorical",
    keras.losses.CategoricalFocalCrossentropy: "categorical",
    keras.losses.BinaryCrossentropy: "binary",
    keras.losses.BinaryFocalCrossentropy: "binary",
}
_BY_NAME = {cls().name: cls for cls in _CLASSES}  # "sparse_categorical_crossentropy": ...
_NAMES = {name: _CLASSES[cls] for name, cls in _BY_NAME.items()}


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


def loss_info(loss: Any) -> LossInfo:
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
    name: str | None = getattr(loss, "__name__", None)
    # Keras' function (from_logits off)
    if name is not None and name in _NAMES and loss is keras.losses.get(name):
        return LossInfo(_NAMES[name], name=name)
    return LossInfo("other", name=name or type(loss).__name__)


@keras.saving.register_keras_serializable(package="tfaccel")
class OneHotCrossentropy(keras.losses.CategoricalCrossentropy):
    """Keras' categorical crossentropy over labels `tfaccel.methods` made one-hot.

    Integer class ids reaching it (validation data not passed through
    `plan.evaluation_data`) are refused with that fix, where Keras would fail on ranks.
    """

    def call(self, y_true: Any, y_pred: Any) -> Any:
        true, pred = tuple(y_true.shape), tuple(y_pred.shape)
        ids = len(true) < len(pred) or (true[-1:] == (1,) and pred[-1] not in (1, None))
        if ids:
            raise ValueError(
                "The loss tfaccel.methods made takes one-hot labels (it made the training "
                f"labels one-hot), but got labels of shape {true} against outputs "
                f"{pred}, class ids (validation or evaluation data given as is). Pass "
                "validation_data=plan.evaluation_data(val) to model.fit, and "
                "plan.evaluation_data(data) to model.evaluate."
            )
        return super().call(y_true, y_pred)


def settings(loss: keras.losses.Loss) -> dict:
    """Every setting of a Keras loss object: its config, its function's keyword
    arguments (the sparse loss's `axis` is only there) and its dtype."""
    found = dict(getattr(loss, "_fn_kwargs", {}))
    found.update(loss.get_config())
    found.pop("fn", None)
    found["dtype"] = loss.dtype
    return found


def soft_target_loss(
    loss: Any, smoothing: float, method: str = "The label methods"
) -> keras.losses.Loss:
    """The loss for soft targets with `smoothing` (or the loss's own, if larger), keeping
    every setting of `loss`: the same class (categorical, binary, focal), or for a sparse
    loss `OneHotCrossentropy`. A name or Keras' function is its class with defaults.

    Raises:
        ValueError: a setting the soft-target loss has no place for, named
            (`ignore_class` of a sparse loss).
    """
    info = loss_info(loss)
    given = loss if isinstance(loss, keras.losses.Loss) else _BY_NAME[info.name]()
    kept = settings(given)
    target = OneHotCrossentropy if info.kind == "sparse" else type(given)
    if kept.get("ignore_class") is not None:
        raise ValueError(
            f"{method} cannot keep ignore_class={kept['ignore_class']!r} of the loss "
            f"{given.name!r}: it trains on one-hot targets, and Keras' categorical "
            "crossentropy has no ignore_class. Give those labels a sample weight of 0 "
            "(batches of (x, y, sample_weight)) instead, or leave the method out."
        )
    kept.pop("ignore_class", None)
    kept["label_smoothing"] = max(float(smoothing), float(kept.get("label_smoothing") or 0.0))
    accepted = inspect.signature(target.__init__).parameters
    left = sorted(k for k in kept if k not in accepted)
    if left:
        raise ValueError(
            f"{method} cannot keep the setting(s) {left} of the loss {given.name!r}: "
            f"{target.__name__} has no such argument. Leave the method out for this loss."
        )
    return target(**kept)


def one_hot_map(classes: int, output_rank: int) -> MapFn:
    """A batch map making integer labels one-hot of the outputs' rank: `(B,)` or `(B, 1)`
    -> `(B, classes)`, `(B, T)` or `(B, T, 1)` -> `(B, T, classes)`."""

    def one_hot(x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
        del seed
        if y.shape.rank == output_rank:
            y = tf.squeeze(y, -1)
        return x, tf.one_hot(tf.cast(y, tf.int32), classes, dtype=tf.float32)

    return one_hot
