"""The learning-rate range test's suggestion rule: pure functions of a (rate, loss) curve.

`suggest` reads a curve of one loss per step under an exponentially ramped rate and
returns the rate to train at, or None with the reason the curve cannot support one.

The rule, in order:

1. The curve is cut at its first non-finite loss. A non-finite first loss, or fewer than
   `MIN_POINTS` finite ones, gives no suggestion ("diverged at once").
2. The loss is smoothed by a running median of `w` points (about a tenth of the curve,
   at least 5): spikes of up to `w // 2` steps (an early spike, one bad batch) vanish.
3. The noise of one loss, sigma, is the robust spread (1.4826 × MAD) of the losses
   around the smoothed curve; a smoothed value is known to about `1.25 sigma / sqrt(w)`,
   and the noise band is `BAND_SIGMAS` (3) of those.
4. The descent is the start (the median of the first `w` losses) minus the smoothed
   minimum. A descent inside the band gives no suggestion: "flat" where the loss barely
   moves and its noise is small (under `FLAT_RELATIVE` of the loss), "too noisy"
   otherwise. A curve whose minimum is within its first half window and that then rises
   beyond the band is "diverged at once". A positive loss that fell by less than
   `MIN_DESCENT` (20 %) of its start gives no suggestion either: the model barely learned
   over the ramp, and where such a curve bends says little about training.
5. The slope of the loss against log10(rate) is a least-squares fit over `w` points
   around each point, the losses clipped to the smoothed curve ± 3 sigma (a spike moves
   no slope): the rate's spacing counts, and the fit's standard error says how
   sure the slope is. A point is *clearly descending* when its slope plus two standard
   errors is below zero and the slope is at least `KEEP_SLOPE` of the steepest one.
6. The divergence is *seen* when the curve holds a non-finite loss or the smoothed loss
   rises after its minimum by more than the band and `SEEN_RISE` (a quarter) of the
   descent. Seen: the suggestion is the largest clearly descending rate at or below the
   minimum, and at most the minimum's rate / `BELOW_MINIMUM` (the minimum is where the
   rate starts to hurt). Unseen (the loss still falls, or levels off, at the ramp's end):
   the minimum says nothing, and the suggestion is the largest clearly descending rate /
   `UNSEEN_BELOW`. No clearly descending point gives "too noisy".

`steepest` is the common alternative (the steepest point of an exponentially smoothed
curve, by index, as Lightning's `lr_find` suggests it), kept to compare against.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

MIN_POINTS = 12  # finite losses below which no curve is read
BAND_SIGMAS = 3.0  # a descent must exceed this many standard errors of a smoothed value
FLAT_RELATIVE = 0.01  # noise under this fraction of the loss: an unmoving curve is "flat"
KEEP_SLOPE = 0.2  # a clearly descending point descends at least this share of the steepest
BELOW_MINIMUM = 3.0  # the suggestion is at most the minimum's rate over this
MIN_DESCENT = 0.2  # a positive loss must fall by this share of its start over the ramp
SEEN_RISE = 0.25  # a rise after the minimum by this share of the descent: divergence seen
UNSEEN_BELOW = 3.0  # divergence unseen: the largest clearly descending rate over this


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """What the rule read from a curve.

    Attributes:
        rate: the suggested rate, or None.
        reason: why that rate, or why none ("flat", "too noisy", "diverged at once",
            "barely learned", with the figures).
        smoothed: the running-median loss, one per finite point (NaN after a cut).
        noise: sigma, the robust noise of one loss.
        descent: the start's loss minus the smoothed minimum.
        minimum_rate: the rate at the smoothed minimum (None when unread).
        window: the smoothing window, in points.
    """

    rate: float | None
    reason: str
    smoothed: list[float]
    noise: float | None = None
    descent: float | None = None
    minimum_rate: float | None = None
    window: int | None = None


class _Read(TypedDict):
    """The figures read from a curve that every later `Suggestion` carries."""

    smoothed: list[float]
    noise: float
    descent: float
    window: int


def window_for(n: int) -> int:
    """The odd smoothing window for a curve of `n` points: about n / 10, at least 5."""
    w = max(5, round(n / 10))
    return w if w % 2 else w + 1


def running_median(values: np.ndarray, w: int) -> np.ndarray:
    """Centred running median of `w` points; the window shrinks at the ends."""
    half = w // 2
    n = len(values)
    return np.array([np.median(values[max(0, i - half) : i + half + 1]) for i in range(n)])


def local_slopes(x: np.ndarray, y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope dy/dx over `w` points around each point, and its standard error."""
    half = w // 2
    n = len(x)
    slopes, errors = np.full(n, np.nan), np.full(n, np.inf)
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i + half + 1)
        xs, ys = x[lo:hi], y[lo:hi]
        if len(xs) < 3:
            continue
        dx = xs - xs.mean()
        sxx = float(dx @ dx)
        if sxx <= 0:
            continue
        slope = float(dx @ (ys - ys.mean())) / sxx
        residual = ys - ys.mean() - slope * dx
        slopes[i] = slope
        errors[i] = math.sqrt(float(residual @ residual) / (len(xs) - 2) / sxx)
    return slopes, errors


def _no_descent(descent: float, band: float, sigma: float, start: float, rates: np.ndarray) -> str:
    """Why a descent within the noise band supports no suggestion: flat or too noisy."""
    if sigma <= FLAT_RELATIVE * max(abs(start), 1e-12):
        return (
            f"flat: the loss moved by {descent:.3g} at most over rates "
            f"{rates[0]:.3g}..{rates[-1]:.3g}, within its noise band "
            f"({band:.3g}); widen the range (max_lr) or check that the model learns"
        )
    return (
        f"too noisy: a descent of {descent:.3g} is within the noise band ({band:.3g}; "
        f"one loss varies by {sigma:.3g}); use a larger batch or more steps"
    )


def suggest(
    rates: Sequence[float] | np.ndarray, losses: Sequence[float] | np.ndarray
) -> Suggestion:
    """The rate to train at, read from a range test's curve (see the module's rule).

    Args:
        rates: the rate of each step, increasing.
        losses: the loss of each step (NaN or inf where it diverged).

    Returns:
        A `Suggestion`; its `rate` is None when the curve cannot support one.
    """
    x = np.log10(np.asarray(rates, dtype=float))
    y = np.asarray(losses, dtype=float)
    if len(y) == 0 or not np.isfinite(y[0]):
        return Suggestion(None, "diverged at once: the loss at the first rate is not finite", [])
    bad = np.flatnonzero(~np.isfinite(y))
    end = int(bad[0]) if len(bad) else len(y)
    if end < MIN_POINTS:
        return Suggestion(
            None,
            f"diverged at once: the curve holds {end} finite losses before it diverges or "
            f"ends (at least {MIN_POINTS} are needed); lower min_lr or max_lr",
            [],
        )
    x, y = x[:end], y[:end]
    w = window_for(end)
    smooth = running_median(y, w)
    sigma = 1.4826 * float(np.median(np.abs(y - smooth)))
    band = BAND_SIGMAS * 1.25 * sigma / math.sqrt(w)
    start = float(np.median(y[:w]))
    i_min = int(np.argmin(smooth))
    descent = start - float(smooth[i_min])
    read = _Read(smoothed=list(smooth), noise=sigma, descent=descent, window=w)
    rates_read = 10.0**x
    rise = float(np.max(smooth[i_min:])) - float(smooth[i_min])
    if i_min <= w // 2 and rise > band:
        why = (
            f"diverged at once: the loss rose from the first rates ({rates_read[0]:.3g}) by "
            f"{rise:.3g} and never fell clearly below its start; lower min_lr"
        )
        return Suggestion(None, why, **read)
    if descent <= band:
        return Suggestion(None, _no_descent(descent, band, sigma, start, rates_read), **read)
    if start > 0 and descent < MIN_DESCENT * start:
        why = (
            f"barely learned: the loss fell only {descent / start:.0%} over the ramp (from "
            f"{start:.3g} to {start - descent:.3g}; at least {MIN_DESCENT:.0%} is needed): the "
            f"model barely learned in {end} steps: ramp over more steps or a larger batch"
        )
        return Suggestion(None, why, **read)
    minimum_rate = float(rates_read[i_min])
    # Winsorized: a spike moves no slope more than a 3-sigma loss would.
    clipped = np.clip(y, smooth - 3.0 * sigma, smooth + 3.0 * sigma)
    slopes, errors = local_slopes(x, clipped, w)
    slopes, errors = slopes[: i_min + 1], errors[: i_min + 1]
    significant = slopes + 2.0 * errors < 0.0
    if not significant.any():
        why = (
            f"too noisy: no rate below the minimum ({minimum_rate:.3g}) descends clearly "
            f"beyond the slope's noise; use a larger batch or more steps"
        )
        return Suggestion(None, why, minimum_rate=minimum_rate, **read)
    steepest_slope = float(np.min(slopes[significant]))
    clear = significant & (slopes <= KEEP_SLOPE * steepest_slope)
    descending = float(rates_read[np.flatnonzero(clear)[-1]])
    if len(bad) or rise > max(band, SEEN_RISE * descent):
        rate = min(descending, minimum_rate / BELOW_MINIMUM)
        why = (
            f"the largest rate still clearly descending is {descending:.3g}; the loss is "
            f"lowest at {minimum_rate:.3g}: suggested {rate:.3g}"
        )
    else:
        rate = descending / UNSEEN_BELOW
        why = (
            f"the largest rate still clearly descending is {descending:.3g}; the divergence "
            f"is not seen (after its minimum at {minimum_rate:.3g} the loss rose by "
            f"{rise / descent:.0%} of its descent, under {SEEN_RISE:.0%}), so the minimum "
            f"says nothing: suggested {descending:.3g} / {UNSEEN_BELOW:g} = {rate:.3g}"
        )
    if i_min >= len(y) - 1 - w // 2:
        why += (
            " (the loss was still lowest at the ramp's last rates: where the rate starts "
            "to hurt is not seen; a larger max_lr would show it)"
        )
    return Suggestion(rate, why, minimum_rate=minimum_rate, **read)


def steepest(
    rates: Sequence[float] | np.ndarray,
    losses: Sequence[float] | np.ndarray,
    beta: float = 0.98,
    skip_begin: int = 10,
    skip_end: int = 1,
) -> float | None:
    """The steepest-descent rule: the rate where an EMA-smoothed loss falls fastest per step.

    The gradient is taken by index (the rates' spacing ignored), as Lightning's `lr_find`
    does. Returns None when the curve is too short.
    """
    y = np.asarray(losses, dtype=float)
    bad = np.flatnonzero(~np.isfinite(y))
    end = int(bad[0]) if len(bad) else len(y)
    if end - skip_begin - skip_end < 3:
        return None
    avg, smooth = 0.0, []
    for i, value in enumerate(y[:end]):
        avg = beta * avg + (1 - beta) * value
        smooth.append(avg / (1 - beta ** (i + 1)))
    part = np.asarray(smooth)[skip_begin : end - skip_end]
    return float(np.asarray(rates, dtype=float)[skip_begin + int(np.argmin(np.gradient(part)))])
