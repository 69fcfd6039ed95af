"""The batch that reaches a given loss soonest: the noise scale and examples/s together.

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", section 2.2: to
reach a given loss, training at batch B takes E = E_min (1 + B / B_noise) examples (and
S = S_min (1 + B_noise / B) steps). With B_simple standing in for B_noise, a batch read
at r(B) examples/s reaches that loss in time ∝ (1 + B / B_simple) / r(B). A larger batch
pays only when its examples/s grows faster than the examples it needs: on a CPU, where a
small CNN's examples/s grew 1.14× from batch 32 to 128 while B_simple ≈ 241 asked for
1.35× the examples, batch 128 took 1.15× as long to reach batch 32's accuracy
(`benchmarks/batch_size.py`).
"""

from __future__ import annotations

import math

from tfaccel.tuning.batch.budget import rate_at
from tfaccel.tuning.batch.report import ProbeRow


def relative_time(batch: int, examples_per_second: float, b_simple: float) -> float:
    """Seconds to a given loss, up to a constant: (1 + batch / B_simple) / examples/s."""
    extra = 0.0 if math.isinf(b_simple) else batch / b_simple
    return (1.0 + extra) / examples_per_second


def soonest_batch(rows: list[ProbeRow], best: int, b_simple: float, knee: float) -> int:
    """The smallest batch <= `best` whose predicted time to a loss is within `knee` of the least.

    The batches are those timed at or below `best`, and `best` itself (when it was not
    timed, at a rate interpolated between the timed batches around it, on log scales).
    With `knee` as for the throughput knee: a batch is within it when (1 - knee) × its
    time <= the least time.
    """
    if not b_simple > 0:
        raise ValueError(f"b_simple must be > 0, got {b_simple!r}.")
    timed = {r.batch_size: r.examples_per_second for r in rows if r.fits and r.examples_per_second}
    rates: dict[int, float | None] = {b: rate for b, rate in timed.items() if b <= best}
    if best not in rates:
        rates[best] = _interpolated(timed, best) or rate_at(rows, best)
    times = {b: relative_time(b, rate, b_simple) for b, rate in rates.items() if rate}
    if not times:
        return best
    least = min(times.values())
    return min(b for b, t in times.items() if (1.0 - knee) * t <= least)


def _interpolated(timed: dict[int, float], batch: int) -> float | None:
    """Examples/s at `batch` between the nearest timed batches below and above it (log-log)."""
    below = [b for b in timed if b < batch]
    above = [b for b in timed if b > batch]
    if not below or not above:
        return None
    low, high = max(below), min(above)
    share = math.log(batch / low) / math.log(high / low)
    return math.exp((1 - share) * math.log(timed[low]) + share * math.log(timed[high]))
