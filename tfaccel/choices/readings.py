"""One answer under noise: candidates' throughput compared by repeated, interleaved readings.

A single reading per candidate lets a busy neighbour decide (on a shared host the batch
finder once read batch 32 at 1,000 examples/s and 64 at 4,880). `compare` reads every
candidate once per round, alternating the order (a drift in the machine's load touches
each alike), and after each round from `min_rounds` on asks `judge` whether the fastest
is faster than every other within a `CONFIDENCE` interval; it stops then, after
`max_rounds`, or once `budget_s` is spent. What the interval does not separate is "no
measurable difference", and the simpler setting (the first candidate of those still in
contention, candidates being listed simplest first) is kept.

The interval is on the paired log-ratios of two candidates' readings of the same round
(Student's t): the round's load cancels out of a ratio, not out of a difference of means.

Example:
    >>> judge({"float32": [100, 104, 98], "bfloat16": [101, 99, 103]}).chosen
    'float32'
    >>> judge({"float32": [100, 104, 98], "bfloat16": [200, 206, 197]}).chosen
    'bfloat16'
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

C = TypeVar("C", bound=Hashable)

CONFIDENCE = 0.95
"""The two-sided confidence of the interval that must exclude "no difference"."""
NO_DIFFERENCE = "no measurable difference"
"""What a comparison says when its interval does not separate the candidates."""
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t 97.5 % quantiles for 1-10 degrees of freedom (1.96 beyond 30)."""


def t_quantile(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (two-sided 95 %)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.96 + 2.4 / df  # within 0.01 of the table from 11 to 30, 1.96 beyond


def interval(differences: Sequence[float]) -> tuple[float, float]:
    """The `CONFIDENCE` interval of the mean of `differences` ((-inf, inf) below two)."""
    n = len(differences)
    if n < 2:
        return -math.inf, math.inf
    mean = statistics.fmean(differences)
    half = t_quantile(n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What a comparison of candidates' readings decided.

    Attributes:
        chosen: the candidate kept: the fastest when `separated`, else the simplest of
            those the interval could not tell from it.
        separated: whether the fastest was faster than every other within the interval.
        readings: each candidate's readings (higher is faster), one per round.
        reason: one line saying what was read and why `chosen` was kept.
        rounds: the paired rounds judged.
    """

    chosen: Hashable
    separated: bool
    readings: Mapping[Any, list[float]]
    reason: str
    rounds: int

    @property
    def means(self) -> dict:
        """Each candidate's geometric mean reading."""
        return {c: _geomean(r) for c, r in self.readings.items()}


def _geomean(values: Sequence[float]) -> float:
    positive = [v for v in values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in positive)) if positive else 0.0


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [math.log(x / y) for x, y in zip(a, b, strict=False) if x > 0 and y > 0]


def judge(readings: Mapping[C, Sequence[float]], tolerance: float = 0.0) -> Comparison:
    """Decides from paired readings ({candidate: readings, simplest first}; round i of
    each is paired): the fastest by geometric mean when its interval over every other
    excludes equality, else the simplest candidate it cannot be told from.

    With a `tolerance` (a fraction, e.g. the batch finder's knee), a candidate counts
    as slower only when the interval puts the fastest more than 1 / (1 - tolerance)
    times ahead of it: the simplest candidate not shown slower is kept, decided
    (`separated`) when its interval lies wholly within the tolerance.

    Raises:
        ValueError: fewer than two candidates, one without a reading, or a
            tolerance outside [0, 1).
    """
    order = list(readings)
    if len(order) < 2 or any(not readings[c] for c in order):
        raise ValueError(f"judge needs two or more candidates with readings, got {dict(readings)}")
    _check_tolerance(tolerance)
    margin = -math.log1p(-tolerance)  # the log-ratio the tolerance allows
    rounds = min(len(readings[c]) for c in order)
    means = {c: _geomean(readings[c][:rounds]) for c in order}
    top = max(order, key=lambda c: means[c])
    bounds = {
        c: interval(_log_ratios(readings[top][:rounds], readings[c][:rounds]))
        for c in order
        if c != top
    }
    tied = [c for c in order if c == top or not bounds[c][0] > margin]
    chosen = tied[0]
    kept = {c: [float(v) for v in readings[c]] for c in order}
    what = f"over {rounds} interleaved round(s), {CONFIDENCE:.0%} interval"
    if len(tied) == 1:
        runner_up = max((c for c in order if c != top), key=lambda c: means[c])
        low, high = (math.exp(b) for b in bounds[runner_up])
        reason = (
            f"{top} fastest: {means[top] / means[runner_up]:.2f}x {runner_up} "
            f"({low:.2f}-{high:.2f}x {what})"
        )
        return Comparison(top, True, kept, reason, rounds)
    versus = chosen if chosen != top else tied[1]
    low, high = (math.exp(b) for b in bounds[versus])
    if tolerance > 0 and chosen != top and bounds[chosen][1] < margin:
        simpler = ", every simpler one slower by more" if order.index(chosen) else ""
        reason = (
            f"{chosen} within {tolerance:.0%} of the fastest, {top} "
            f"({means[top] / means[chosen]:.2f}x, {_range(low, high)} {what}){simpler}: "
            f"kept the simpler {chosen}"
        )
        return Comparison(chosen, True, kept, reason, rounds)
    beyond = f" beyond {tolerance:.0%}" if tolerance > 0 else ""
    reason = (
        f"{NO_DIFFERENCE}{beyond} between {', '.join(map(str, tied))} ({top} "
        f"{means[top] / means[versus]:.2f}x {versus}, {_range(low, high)} {what}): kept "
        f"the simpler {chosen}"
    )
    return Comparison(chosen, False, kept, reason, rounds)


def _check_tolerance(tolerance: float) -> None:
    if isinstance(tolerance, bool) or not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")


def _range(low: float, high: float) -> str:
    if math.isinf(high) or low == 0:
        return "unbounded"
    return f"{low:.2f}-{high:.2f}x"


def compare(
    read: Callable[[C], float],
    candidates: Sequence[C],
    *,
    budget_s: float | None = None,
    min_rounds: int = 3,
    max_rounds: int = 10,
    prior: Mapping[C, Sequence[float]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    settle: Callable[[bool], bool] | None = None,
    tolerance: float = 0.0,
) -> Comparison:
    """Reads `candidates` (simplest first) in interleaved rounds until `judge` separates
    the fastest, `max_rounds` are read, or `budget_s` (by `clock`) is spent.

    Args:
        read: one reading of a candidate's throughput (higher is faster).
        candidates: two or more, simplest first (kept when nothing separates them).
        budget_s: seconds of readings after which no new round starts (None: no limit).
        min_rounds: rounds read before judging (at least 2: one reading has no spread).
        max_rounds: rounds after which the comparison ends undecided.
        prior: readings already taken, paired round by round (they count as rounds).
        clock: the time source (a fake one in tests).
        settle: maps this process's "stop" to the one every worker acts on (a
            multi-worker job must read the same rounds on every worker).
        tolerance: what `judge` lets the fastest lead by before a simpler one counts as
            slower (0: any lead shown).

    Raises:
        ValueError: fewer than two candidates, `min_rounds` < 2 or > `max_rounds`, or a
            tolerance outside [0, 1).
    """
    if len(candidates) < 2:
        raise ValueError(f"compare needs two or more candidates, got {list(candidates)}")
    if not 2 <= min_rounds <= max_rounds:
        raise ValueError(
            f"need 2 <= min_rounds <= max_rounds, got min_rounds={min_rounds}, "
            f"max_rounds={max_rounds}"
        )
    _check_tolerance(tolerance)
    readings = {c: [float(v) for v in (prior or {}).get(c, ())] for c in candidates}
    began = clock()
    while True:
        rounds = min(len(r) for r in readings.values())
        if rounds >= min_rounds:
            verdict = judge(readings, tolerance)
            spent = budget_s is not None and clock() - began >= budget_s
            stop = verdict.separated or rounds >= max_rounds or spent
            if settle(stop) if settle is not None else stop:
                return verdict
        order = list(candidates) if rounds % 2 == 0 else list(reversed(candidates))
        for c in order:
            if len(readings[c]) <= rounds:
                readings[c].append(float(read(c)))
