"""The gradient noise scale: the batch past which a larger one buys little per example.

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", appendix A.1. The
gradient of a batch of B examples, G_B, is the true gradient G plus noise of covariance
Σ/B, so E|G_B|² = |G|² + tr(Σ)/B. Measuring |G_B|² at a small and a big batch gives
unbiased estimates of both terms:

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

and their ratio B_simple = tr(Σ) / |G|² estimates the critical batch: well below it,
doubling the batch nearly halves the steps to a given loss (the same examples, fewer
steps); well above it, a larger batch costs examples for nothing. The estimate is for
the weights it is measured at (the noise scale grows as training proceeds).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class NoiseScale:
    """A gradient-noise-scale estimate.

    Attributes:
        b_simple: tr(Σ) / |G|², the critical-batch estimate (inf when |G|² ≤ 0: the
            gradient is lost in the noise, so no batch is too large to help).
        gradient_sq: the estimate of |G|².
        trace_sigma: the estimate of tr(Σ), the per-example gradient variance.
        small, big: the two batch sizes measured.
        small_batches, batches: how many batches of each size were averaged.
    """

    b_simple: float
    gradient_sq: float
    trace_sigma: float
    small: int
    big: int
    small_batches: int
    batches: int

    def __str__(self) -> str:
        value = "unbounded" if math.isinf(self.b_simple) else f"{self.b_simple:,.0f}"
        return (
            f"gradient noise scale B_simple ≈ {value} (|G|² {self.gradient_sq:.3g}, tr Σ "
            f"{self.trace_sigma:.3g}; {self.small_batches} batches of {self.small}, "
            f"{self.batches} of {self.big})"
        )


def _squared_norm_fn(model: keras.Model, loss):
    loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss

    @tf.function
    def squared_norm(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(value, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads])

    return squared_norm


def gradient_noise_scale(
    model: keras.Model,
    data: tf.data.Dataset,
    loss,
    *,
    small: int = 8,
    big: int = 256,
    batches: int = 16,
    small_batches: int | None = None,
    seed: int = 0,
) -> NoiseScale:
    """Estimates B_simple for `model` at its current weights on `data` (unbatched (x, y)).

    Args:
        model: a built Keras model (its weights are not changed; in training mode its
            BatchNorm statistics may be).
        data: an unbatched dataset of `(x, y)` with at least `big` examples.
        loss: a Keras loss (name, function or object), averaged over the batch.
        small, big: the two batch sizes (small < big).
        batches: big batches whose squared gradient norms are averaged.
        small_batches: small batches averaged; default `8 * batches` (they are cheap, and
            their noisier norms decide the estimate's spread).
        seed: the shuffle seed that draws the batches.

    Raises:
        ValueError: `small` >= `big`, sizes < 1, or fewer than `big` examples.
    """
    if not 1 <= small < big or batches < 1:
        raise ValueError(
            f"Need 1 <= small < big and batches >= 1, got small={small}, big={big}, "
            f"batches={batches}."
        )
    count = int(data.cardinality())
    if 0 <= count < big:
        raise ValueError(f"The data holds {count} examples, fewer than big={big}.")
    squared_norm = _squared_norm_fn(model, loss)
    means = {}
    counts = {small: small_batches or 8 * batches, big: batches}
    for size, count in counts.items():
        drawn = data.shuffle(10_000, seed=seed, reshuffle_each_iteration=True).repeat()
        values = [
            float(squared_norm(x, y)) for x, y in drawn.batch(size, drop_remainder=True).take(count)
        ]
        means[size] = sum(values) / len(values)
    gradient_sq = (big * means[big] - small * means[small]) / (big - small)
    trace_sigma = (means[small] - means[big]) / (1 / small - 1 / big)
    b_simple = trace_sigma / gradient_sq if gradient_sq > 0 else math.inf
    return NoiseScale(
        max(b_simple, 0.0), gradient_sq, trace_sigma, small, big, counts[small], batches
    )
