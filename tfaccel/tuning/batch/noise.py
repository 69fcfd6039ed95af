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

When B_simple is far above the big batch, |G|² is a small difference of two large,
noisy means: on the CIFAR-shaped MLP of `benchmarks/batch_size_jobs.py` (B_simple ≈ 500,
batches of 8 and 64), three seeds at the same weights read 0, 650 and unbounded. The
estimate's relative standard error (`NoiseScale.relative_error`, delta method) says so.
A batch is bounded by the largest B_simple the estimate supports, `upper_limit` (|G|²
`Z` standard errors lower); from `MAX_ERROR` = 1 / `Z` on that is unbounded: the
estimate is not `reliable` and bounds nothing.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import keras
import tensorflow as tf

from tfaccel.data.iterators import adopt
from tfaccel.data.order.augment_seeds import without_global_seed

Z = 2.0  # standard errors: the bound is the largest B_simple the estimate supports at Z
MAX_ERROR = 1.0 / Z  # from this relative standard error on, that bound is unbounded


def upper_limit(b_simple: float, relative_error: float | None) -> float:
    """The largest B_simple the estimate supports, b / (1 - Z × error); inf from `MAX_ERROR`."""
    if relative_error is None or not relative_error < MAX_ERROR:
        return math.inf
    return b_simple / (1.0 - Z * relative_error)


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
        relative_error: the estimate's relative standard error (delta method; inf when
            either term came out <= 0 or too few batches were drawn to tell).
    """

    b_simple: float
    gradient_sq: float
    trace_sigma: float
    small: int
    big: int
    small_batches: int
    batches: int
    relative_error: float = math.inf

    @property
    def reliable(self) -> bool:
        """Whether the estimate is precise enough to bound a batch (error < `MAX_ERROR`)."""
        return self.relative_error < MAX_ERROR

    @property
    def upper(self) -> float:
        """The largest B_simple it supports (`upper_limit`): the bound on a batch."""
        return upper_limit(self.b_simple, self.relative_error)

    def __str__(self) -> str:
        value = "unbounded" if math.isinf(self.b_simple) else f"{self.b_simple:,.0f}"
        return (
            f"gradient noise scale B_simple ≈ {value} ± {error_text(self.relative_error)} "
            f"(|G|² {self.gradient_sq:.3g}, tr Σ "
            f"{self.trace_sigma:.3g}; {self.small_batches} batches of {self.small}, "
            f"{self.batches} of {self.big})"
        )


def error_text(relative_error: float | None) -> str:
    """A relative standard error as a percentage ("unbounded" when inf, "?" when unknown)."""
    if relative_error is None:
        return "?"
    return "unbounded" if math.isinf(relative_error) else f"{relative_error:.0%}"


def _squared_norm_fn(model: keras.Model, loss, element_spec):
    """|∇ loss|² of a batch, traced once for every batch size (the batch dimension is None)."""
    loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    x_spec, y_spec = (
        tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)
        for spec in element_spec
    )

    @tf.function(input_signature=[x_spec, y_spec])
    def squared_norm(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(value, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads])

    return squared_norm


def relative_error(small: int, big: int, small_norms: list, big_norms: list) -> float:
    """The estimate's relative standard error, by the delta method (inf: too few to tell).

    B_simple = S / G with S, G linear in the two means of squared norms; their
    variances are the sample variances over the counts (the two sizes drawn apart).
    """
    if len(small_norms) < 2 or len(big_norms) < 2:
        return math.inf
    m_s, m_b = statistics.fmean(small_norms), statistics.fmean(big_norms)
    var_s = statistics.variance(small_norms) / len(small_norms)
    var_b = statistics.variance(big_norms) / len(big_norms)
    k_s, k_g = 1 / (1 / small - 1 / big), 1 / (big - small)
    trace, gradient = k_s * (m_s - m_b), k_g * (big * m_b - small * m_s)
    if gradient <= 0 or trace <= 0:
        return math.inf
    d_small = (k_s * gradient + small * k_g * trace) / gradient**2
    d_big = (k_s * gradient + big * k_g * trace) / gradient**2
    return math.sqrt(d_small**2 * var_s + d_big**2 * var_b) / (trace / gradient)


def gradient_noise_scale(
    model: keras.Model,
    data: tf.data.Dataset,
    loss: Any,
    *,
    small: int = 8,
    big: int = 256,
    batches: int = 16,
    small_batches: int | None = None,
    seed: int = 0,
    tolerance: float | None = None,
    min_batches: int = 4,
) -> NoiseScale:
    """Estimates B_simple for `model` at its current weights on `data` (unbatched (x, y)).

    The batches are drawn in rounds of one big batch and `small_batches / batches`
    small ones; the gradient is traced once for both sizes.

    Args:
        model: a built Keras model (its weights are not changed; in training mode its
            BatchNorm statistics may be).
        data: an unbatched dataset of `(x, y)` with at least `big` examples.
        loss: a Keras loss (name, function or object), averaged over the batch.
        small: the small batch size (< `big`).
        big: the big batch size.
        batches: big batches whose squared gradient norms are averaged (at most, with
            `tolerance`).
        small_batches: small batches averaged; default `8 * batches` (they are cheap, and
            their noisier norms decide the estimate's spread).
        seed: the shuffle seed that draws the batches.
        tolerance: stop early, after at least `min_batches` rounds, once the estimate's
            relative standard error (delta method) is at most this; None: all batches.
        min_batches: the fewest rounds before `tolerance` may stop the draws (>= 2).

    Raises:
        ValueError: `small` >= `big`, sizes < 1, fewer than `big` examples, a
            `tolerance` <= 0 or `min_batches` < 2.
    """
    if not 1 <= small < big or batches < 1:
        raise ValueError(
            f"Need 1 <= small < big and batches >= 1, got small={small}, big={big}, "
            f"batches={batches}."
        )
    if tolerance is not None and not tolerance > 0:
        raise ValueError(f"tolerance must be a relative error > 0 (e.g. 0.1), got {tolerance!r}.")
    if min_batches < 2:
        raise ValueError(f"min_batches must be >= 2 (a variance needs two), got {min_batches!r}.")
    count = int(data.cardinality())
    if 0 <= count < big:
        raise ValueError(f"The data holds {count} examples, fewer than big={big}.")
    squared_norm = _squared_norm_fn(model, loss, data.element_spec)
    small_count = small_batches or 8 * batches
    buffer = 10_000 if count < 0 else min(count, 10_000)

    def draws(size: int, offset: int):
        with without_global_seed():  # the same batches whatever global seed is in force
            shuffled = data.shuffle(buffer, seed=seed + offset, reshuffle_each_iteration=True)
        return adopt(iter(shuffled.repeat().batch(size, drop_remainder=True)))

    small_iter, big_iter = draws(small, 0), draws(big, 1)
    norms: dict[int, list[float]] = {small: [], big: []}
    for round_ in range(1, batches + 1):
        norms[big].append(float(squared_norm(*next(big_iter))))
        while len(norms[small]) < small_count * round_ // batches:
            norms[small].append(float(squared_norm(*next(small_iter))))
        if (
            tolerance is not None
            and round_ >= min_batches
            and relative_error(small, big, norms[small], norms[big]) <= tolerance
        ):
            break
    means = {size: statistics.fmean(values) for size, values in norms.items()}
    gradient_sq = (big * means[big] - small * means[small]) / (big - small)
    trace_sigma = (means[small] - means[big]) / (1 / small - 1 / big)
    b_simple = trace_sigma / gradient_sq if gradient_sq > 0 else math.inf
    return NoiseScale(
        max(b_simple, 0.0),
        gradient_sq,
        trace_sigma,
        small,
        big,
        len(norms[small]),
        len(norms[big]),
        relative_error(small, big, norms[small], norms[big]),
    )
