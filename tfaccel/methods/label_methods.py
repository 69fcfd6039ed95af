"""Label smoothing, MixUp and CutMix: the methods that train on soft targets.

MixUp and CutMix are batch maps: each batch is mixed with a permutation of itself,
the images by Keras' own `keras.layers.MixUp` / `keras.layers.CutMix`
(`transform_images`), other features by the same linear mix, and the labels by
`mix_labels` in their own shape (a binary job's `(B,)` stays `(B,)`, where Keras'
`transform_labels` would make it `(B, B)`). The random draws (each example's weight,
the permutation, CutMix's box) are stateless, from a per-batch seed (see
`tfaccel.methods.composition.transform`), so the same seed mixes the same way; Keras'
layers draw from a stateful generator, which neither a test nor a resumed run can repeat.

Example:
    >>> plan = methods.for_fit([methods.MixUp(0.2), methods.LabelSmoothing(0.1)],
    ...                        model, ds, epochs=10, loss="sparse_categorical_crossentropy")
    ... # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfaccel.methods import label_checks, labels
from tfaccel.methods.base import Card, Job, Method, MethodPlan


def _fraction(value: Any, name: str, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}.")
    value = float(value)
    if not (0.0 < value < 1.0 if low_open else 0.0 <= value < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {value}.")
    return value


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def use_soft_targets(plan: MethodPlan, method: str) -> None:
    """Soft targets from here on: sparse labels become one-hot (once), the loss categorical
    (the user's loss with every setting kept: `labels.soft_target_loss`)."""
    job = plan.job
    if job.loss_info.kind == "sparse" and not plan.one_hot:
        plan.one_hot = True
        output = label_checks.output_of(job)
        plan.add_map("one-hot labels", labels.one_hot_map(int(output[-1]), len(output)), 1)
    plan.loss = labels.soft_target_loss(job.loss, plan.smoothing, method)


class LabelSmoothing(Method):
    """Trains on targets `(1 - eps) * one_hot + eps / classes` (Keras' `label_smoothing`).

    The loss keeps every setting of the user's (reduction, `from_logits`, axis, name)
    and gains `label_smoothing=eps`. With sparse integer labels (one class id per output
    position: `(B,)`, or `(B, T)` for sequences) the batches' labels become one-hot and
    the loss categorical; validate on `plan.evaluation_data(val)`.

    Args:
        eps: the smoothing, in (0, 1); 0.1 is the usual value.
    """

    name = "label smoothing"
    card = Card(
        changes=(
            "the loss: targets `(1 - eps) * one_hot + eps / classes` (Keras' "
            "`label_smoothing`); sparse labels become one-hot and the loss categorical, "
            "`from_logits` kept"
        ),
        helps='inside `"fast"`, with one-cycle; alone it raised the digits jobs\' final accuracy',
        hurts=(
            "alone, the time to a target (up to 1.18× on the table); costs a one-hot map per "
            "batch; classification only (a regression loss or target is refused)"
        ),
        measured=(
            "Alone: epochs 0.89× (CNN), 1.00× (ResNet), 0.94× (GRU), 0.83× (table); time "
            "1.01×, 0.94×, 1.06×, 1.18×; final accuracy up on the digits jobs."
        ),
        defaults='eps=0.1, the usual value and the one measured; `"fast"` uses it',
        measured_as="LabelSmoothing(0.1)",
        contender="label_smoothing",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, eps: float = 0.1):
        self.eps = _fraction(eps, "LabelSmoothing eps")

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the loss: targets smoothed by {self.eps:g} (categorical crossentropy)"

    def check(self, job: Job) -> None:
        label_checks.check_class_labels(job, "LabelSmoothing")

    def apply(self, plan: MethodPlan) -> None:
        plan.smoothing = self.eps
        use_soft_targets(plan, "LabelSmoothing")


def beta(shape: Any, alpha: float, seed: Any) -> tf.Tensor:
    """Beta(alpha, alpha) draws from a stateless seed: G1 / (G1 + G2) of two gammas."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    g1 = tf.random.stateless_gamma(shape, seeds[0], alpha)
    g2 = tf.random.stateless_gamma(shape, seeds[1], alpha)
    return g1 / (g1 + g2)


def permutation(batch: Any, seed: Any) -> tf.Tensor:
    """A stateless random permutation of `range(batch)`."""
    return tf.argsort(tf.random.stateless_uniform([batch], seed))


def mix_labels(y: Any, transformation: dict) -> tf.Tensor:
    """`w * y + (1 - w) * y[perm]` per example, as float, in the labels' own shape: `w`
    spans every axis after the batch (binary `(B,)`, one-hot `(B, C)`, `(B, T, C)`)."""
    y = tf.cast(y, tf.float32)
    weight = tf.reshape(transformation["mix_weight"], [-1] + [1] * (y.shape.rank - 1))
    other = tf.gather(y, transformation["permutation_order"])
    return weight * y + (1.0 - weight) * other


class MixUp(Method):
    """Each batch becomes `w * batch + (1 - w) * batch[perm]`, labels alike; w ~ Beta(a, a).

    Images (rank 4) are mixed by `keras.layers.MixUp`; other float features (rows,
    sequences) by the same formula. Sparse labels become one-hot first; binary labels
    (one sigmoid unit) are mixed as floats in their own shape.

    Args:
        alpha: the Beta distribution's parameter (> 0); 0.2 is ImageNet's usual value.
    """

    name = "mixup"
    card = Card(
        changes=(
            "the inputs and labels: each batch mixed with a permutation of itself, the "
            "weight ~ Beta(alpha, alpha) (`keras.layers.MixUp` for images)"
        ),
        helps="long trainings, as a regularizer (not measured here)",
        hurts=(
            "short jobs: it only lengthened their path; float features only (token ids "
            'cannot be averaged); not in `"fast"`'
        ),
        measured=(
            "Reached the digits CNN's target in 3 of 5 seeds (epochs 1.43×), the GRU's in 3 "
            "of 5, the table's at 1.80× the time."
        ),
        defaults="alpha=0.2, ImageNet's usual value (not set by a measurement here)",
        measured_as="MixUp(0.2)",
        contender="mixup",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, alpha: float = 0.2):
        self.alpha = _positive(alpha, "MixUp alpha")
        self._layer = keras.layers.MixUp(alpha=self.alpha)

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the labels and inputs: batches mixed pairwise, weight ~ Beta({self.alpha:g})"

    def check(self, job: Job) -> None:
        label_checks.check_class_labels(job, "MixUp")
        spec = job.feature_spec
        if not isinstance(spec, tf.TensorSpec) or not spec.dtype.is_floating:
            raise TypeError(
                f"MixUp mixes float features, got {spec}. Integer features (token ids) "
                "cannot be averaged; leave MixUp out for them."
            )

    def transformation(self, batch: Any, seed: Any) -> dict:
        """The random part of one batch: each example's weight and the permutation."""
        seeds = tf.random.experimental.stateless_split(seed, 2)
        return {
            "mix_weight": beta([batch], self.alpha, seeds[0]),
            "permutation_order": permutation(batch, seeds[1]),
        }

    def mix(self, x: Any, y: Any, transformation: dict) -> tuple[Any, Any]:
        """Mixes one batch with a given transformation (`mix_weight`, `permutation_order`)."""
        if x.shape.rank == 4:
            mixed = self._layer.transform_images(x, transformation)
        else:
            weight = tf.reshape(transformation["mix_weight"], [-1] + [1] * (x.shape.rank - 1))
            weight = tf.cast(weight, x.dtype)
            other = tf.gather(x, transformation["permutation_order"])
            mixed = weight * x + (1.0 - weight) * other
        return mixed, mix_labels(y, transformation)

    def apply(self, plan: MethodPlan) -> None:
        use_soft_targets(plan, "MixUp")

        def mixup(x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
            return self.mix(x, y, self.transformation(tf.shape(x)[0], seed))

        plan.add_map(self.name, mixup, 2)


class CutMix(Method):
    """A box of each image is pasted from another of the batch; labels mixed by its area.

    The box covers a `1 - w` share of the image, w ~ Beta(a, a); the labels' weight is
    the share of pixels kept (counted on the pixel grid, so labels and pixels agree).
    Images are mixed by `keras.layers.CutMix.transform_images`, labels by `mix_labels`.

    Args:
        alpha: the Beta distribution's parameter (> 0); 1.0 is the paper's value.
    """

    name = "cutmix"
    kinds = ("image",)
    card = Card(
        changes=(
            "the inputs and labels: a box of each image pasted from another of the batch, "
            "the labels weighed by its pixels (`keras.layers.CutMix`)"
        ),
        helps="long trainings on images, as a regularizer (not measured here)",
        hurts=('short jobs: it only lengthened their path; images only (rank 4); not in `"fast"`'),
        measured="Reached the digits CNN's target in 1 of 5 seeds.",
        defaults="alpha=1.0, the paper's value (not set by a measurement here)",
        measured_as="CutMix(1.0)",
        contender="cutmix",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, alpha: float = 1.0):
        self.alpha = _positive(alpha, "CutMix alpha")
        self._layer = keras.layers.CutMix()

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return f"the labels and inputs: a box pasted between images, area ~ Beta({self.alpha:g})"

    def check(self, job: Job) -> None:
        label_checks.check_class_labels(job, "CutMix")
        spec = job.feature_spec
        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank != 4:
            shape = getattr(spec, "shape", spec)
            raise ValueError(
                f"CutMix cuts boxes out of images (batch, height, width, channels), got "
                f"features of shape {shape}. For rows or sequences use MixUp instead."
            )

    def transformation(self, shape: Any, seed: Any) -> dict:
        """The random part of one batch: box masks, kept share and the permutation."""
        batch, height, width = shape[0], shape[1], shape[2]
        seeds = tf.random.experimental.stateless_split(seed, 3)
        ratio = tf.sqrt(1.0 - beta([batch], self.alpha, seeds[0]))
        corners = tf.random.stateless_uniform([2, batch], seeds[1])
        h, w = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
        y0, x0 = corners[0] * h * (1.0 - ratio), corners[1] * w * (1.0 - ratio)
        rows = tf.range(h)[None, :, None]
        cols = tf.range(w)[None, None, :]
        inside = (rows >= y0[:, None, None]) & (rows < (y0 + ratio * h)[:, None, None])
        inside &= (cols >= x0[:, None, None]) & (cols < (x0 + ratio * w)[:, None, None])
        return self.box_transformation(inside, permutation(batch, seeds[2]))

    @staticmethod
    def box_transformation(inside: Any, order: Any) -> dict:
        """The transformation of given boxes: `inside` (batch, height, width) is True where
        the other image's pixels are pasted; `order` the permutation."""
        inside = tf.convert_to_tensor(inside)
        pasted = tf.reduce_mean(tf.cast(inside, tf.float32), axis=[1, 2])
        return {
            "batch_masks": inside[..., None],
            "mix_weight": 1.0 - pasted,
            "permutation_order": tf.convert_to_tensor(order),
        }

    def mix(self, x: Any, y: Any, transformation: dict) -> tuple[Any, Any]:
        """Mixes one batch with a given transformation (`box_transformation`'s)."""
        masks = transformation["batch_masks"]
        masks = tf.broadcast_to(masks, tf.concat([tf.shape(masks)[:3], tf.shape(x)[3:]], 0))
        images = self._layer.transform_images(x, {**transformation, "batch_masks": masks})
        return images, mix_labels(y, transformation)

    def apply(self, plan: MethodPlan) -> None:
        use_soft_targets(plan, "CutMix")

        def cutmix(x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
            return self.mix(x, y, self.transformation(tf.shape(x), seed))

        plan.add_map(self.name, cutmix, 2)
