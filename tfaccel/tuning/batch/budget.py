"""The batch-size search's time budget: when to stop starting candidates, what is left.

The bound is the smaller of `budget_s` and `PROBE_AIM` of the tuned job's time
(`job_examples` at the fastest examples/s measured so far: under the `PROBE_SHARE`
promised, as the probes' examples/s read low). A candidate is not started
when its predicted end (the last candidate's fixed cost — build, compile, first step —
plus its steps at the last measured rate) plus the `reserve` kept for what follows it
(the noise-scale estimate) would pass the bound as it will stand once the candidate is
timed: a faster batch shrinks a share-of-the-job bound, so the candidate's examples/s
is projected from the trend so far (in proportion to the batch after one candidate; as
the last two grew after two). At least one candidate always runs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from tfaccel.tuning.batch.report import ProbeRow

logger = logging.getLogger("tfaccel")

PROBE_SHARE = 0.1  # of the tuned job's time, at most, with `job_examples`
# What the search aims at to keep that promise: a probe syncs with the host after every
# step to time it, so its examples/s reads low (0.81x the tuned training's on the
# CIFAR-shaped MLP job of benchmarks/batch_size.py), and a limit of exactly PROBE_SHARE
# at the probes' rate spent 11.7 % of that training.
PROBE_AIM = 0.75 * PROBE_SHARE
NOISE_SHARE = 0.5  # of the time limit, at most, kept for the noise scale's warm-up


def fixed_seconds(row: ProbeRow, steps: int) -> float:
    """A probe's cost besides its steps: building, compiling, tracing (>= 0)."""
    if row.seconds is None or not row.examples_per_second:
        return 0.0
    return max(0.0, row.seconds - (steps + 1) * row.batch_size / row.examples_per_second)


def rate_at(rows: list[ProbeRow], batch: int) -> float | None:
    """Examples/s measured at the largest timed batch <= `batch` (else the smallest timed)."""
    timed = sorted(
        (r.batch_size, r.examples_per_second) for r in rows if r.fits and r.examples_per_second
    )
    if not timed:
        return None
    below = [rate for size, rate in timed if size <= batch]
    return below[-1] if below else timed[0][1]


def fastest_after(rows: list[ProbeRow], batch: int) -> float | None:
    """The examples/s a probe of `batch` may reach: the last rate grown by the trend so far.

    With one candidate timed, in proportion to the batch (the most it can grow); with
    two, as the last two grew (rate ∝ batch^e, e measured between them, within [0, 1]).
    """
    ran = [(r.batch_size, r.examples_per_second) for r in rows if r.fits and r.examples_per_second]
    if not ran:
        return None
    last_batch, last_rate = ran[-1]
    exponent = 1.0
    earlier = [(size, rate) for size, rate in ran[:-1] if size < last_batch]
    if earlier:
        before_batch, before_rate = earlier[-1]
        growth = last_rate / before_rate
        exponent = math.log(max(growth, 1.0)) / math.log(last_batch / before_batch)
        exponent = min(exponent, 1.0)
    grown = last_rate * max(1.0, batch / last_batch) ** exponent
    return max(grown, *(rate for _, rate in ran))


class TimeLimit:
    """When the search must stop starting candidates: `budget_s`, or a share of the job."""

    def __init__(
        self,
        began: float,
        budget_s: float | None,
        job_examples: int | None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.began, self.budget_s, self.job_examples = began, budget_s, job_examples
        self.clock = clock
        self.announced = False

    def seconds(self, rows: list[ProbeRow], fastest: float | None = None) -> float | None:
        """The whole search's time limit now, or once `fastest` examples/s is measured."""
        limits = [] if self.budget_s is None else [self.budget_s]
        rates = [r.examples_per_second for r in rows if r.fits and r.examples_per_second]
        if fastest:
            rates.append(fastest)
        if self.job_examples is not None and rates:
            limits.append(PROBE_AIM * self.job_examples / max(rates))
        return min(limits) if limits else None

    def elapsed(self) -> float:
        return self.clock() - self.began

    def left(self, rows: list[ProbeRow]) -> float | None:
        """Seconds left of the whole limit (None: unbounded)."""
        limit = self.seconds(rows)
        return None if limit is None else limit - self.elapsed()

    def spent(
        self,
        rows: list[ProbeRow],
        batch: int | None = None,
        steps: int = 0,
        reserve: Callable[[float], float] | None = None,
    ) -> bool:
        """Whether a probe of `batch` would pass the limit with `reserve(limit)` s kept after it."""
        limit = self.seconds(rows)
        if limit is None:
            return False
        predicted = 0.0
        ran = [(r, r.examples_per_second) for r in rows if r.fits and r.examples_per_second]
        if batch is not None and ran:
            last, rate = ran[-1]
            predicted = fixed_seconds(last, steps) + (steps + 1) * batch / rate
            limit = self.seconds(rows, fastest_after(rows, batch))
            assert limit is not None  # bounded before: more rates only add a bound
        kept = reserve(limit) if reserve is not None else 0.0
        if not self.announced:
            logger.info(
                "find_batch_size: probing for at most %.1f s (%.1f s kept for the noise scale)",
                limit,
                kept,
            )
            self.announced = True
        return self.elapsed() + predicted + kept >= limit


def declined(
    limit: TimeLimit,
    rows: list[ProbeRow],
    batch: int,
    steps: int,
    reserve: Callable[[float], float] | None = None,
) -> str:
    """Why the search stopped at its first reading: what it spent, what a probe of `batch`
    would cost, and from what job size (or `budget_s`) that probe fits."""
    ran = [(r, r.examples_per_second) for r in rows if r.fits and r.examples_per_second]
    (last, rate), spent = ran[-1], limit.elapsed()
    predicted = fixed_seconds(last, steps) + (steps + 1) * batch / rate
    needed = _with_reserve(spent + predicted, reserve)  # the smallest limit it fits in
    text = f"declined at the first reading, after {spent:.2g} s"
    if limit.job_examples is not None:
        job_s = limit.job_examples / max(rate for _, rate in ran)
        text += f" ({spent / job_s:.1%} of the job's {job_s:.3g} s)"
    text += f": a probe of batch {batch} would take {predicted:.2g} s more"
    if limit.job_examples is None or (limit.budget_s is not None and limit.budget_s < needed):
        return f"{text}, past budget_s={limit.budget_s:g}; from budget_s={needed:.2g} up it fits"
    fastest = fastest_after(rows, batch)
    assert fastest is not None  # `ran` is not empty
    threshold = math.ceil(needed * fastest / PROBE_AIM)
    return (
        f"{text}, past {PROBE_AIM:.1%} of the job; from {threshold:,} examples up, "
        f"a probe of batch {batch} fits"
    )


def _with_reserve(seconds: float, reserve: Callable[[float], float] | None) -> float:
    """The least limit L with `seconds + reserve(L) <= L` (the reserve grows at most half
    as fast as the limit: the iteration converges)."""
    limit = seconds
    for _ in range(60):
        limit = seconds + (reserve(limit) if reserve is not None else 0.0)
    return limit * (1 + 1e-9)
