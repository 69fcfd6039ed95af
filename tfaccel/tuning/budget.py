"""The batch-size search's time budget: when to stop starting candidates, what is left.

The bound is the smaller of `budget_s` and `PROBE_SHARE` of the tuned job's time
(`job_examples` at the fastest examples/s measured so far). With the noise scale on,
the candidates get `1 - NOISE_SHARE` of it and the noise-scale estimate the rest. A
candidate is not started when its predicted end (the last candidate's fixed cost —
build, compile, first step — plus its steps at the last measured rate) would pass
the candidates' share; at least one candidate always runs.
"""

from __future__ import annotations

import logging
import time

from tfaccel.tuning.report import ProbeRow

logger = logging.getLogger("tfaccel")

PROBE_SHARE = 0.1  # of the tuned job's time, at most, with `job_examples`
NOISE_SHARE = 0.5  # of the search's time limit, kept for the noise-scale estimate


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


class TimeLimit:
    """When the search must stop starting candidates: `budget_s`, or a share of the job."""

    def __init__(self, began: float, budget_s: float | None, job_examples: int | None, noise: bool):
        self.began, self.budget_s, self.job_examples = began, budget_s, job_examples
        self.noise = noise
        self.announced = False

    def seconds(self, rows: list[ProbeRow]) -> float | None:
        """The whole search's time limit now (None: unbounded)."""
        limits = [] if self.budget_s is None else [self.budget_s]
        rates = [r.examples_per_second for r in rows if r.fits and r.examples_per_second]
        if self.job_examples is not None and rates:
            limits.append(PROBE_SHARE * self.job_examples / max(rates))
        return min(limits) if limits else None

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def left(self, rows: list[ProbeRow]) -> float | None:
        """Seconds left of the whole limit (None: unbounded)."""
        limit = self.seconds(rows)
        return None if limit is None else limit - self.elapsed()

    def spent(self, rows: list[ProbeRow], batch: int | None = None, steps: int = 0) -> bool:
        """Whether the candidates' share is spent, or would be by a probe of `batch`."""
        limit = self.seconds(rows)
        if limit is None:
            return False
        share = limit * (1 - NOISE_SHARE) if self.noise else limit
        if not self.announced:
            logger.info(
                "find_batch_size: probing for at most %.1f s (%.1f s for candidates)",
                limit,
                share,
            )
            self.announced = True
        predicted = 0.0
        ran = [r for r in rows if r.fits and r.examples_per_second]
        if batch is not None and ran:
            last = ran[-1]
            predicted = fixed_seconds(last, steps) + (steps + 1) * batch / last.examples_per_second
        return self.elapsed() + predicted >= share
