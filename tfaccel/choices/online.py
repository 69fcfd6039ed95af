"""XLA chosen on the job's own steps: the first loops alternate the plain and the XLA step.

Where the job is long enough (`resolution`: the first epoch holds at least the steps
`timing.too_short_for_xla` asks of a probe), `jit_compile="auto"` is not probed before
step 1: the Trainer's first loops alternate the two candidates, and every one of their
steps trains the model (nothing is thrown away). Each candidate's first loop traces (and
XLA's compiles) and is not read; after it, the loops are paired in interleaved rounds
(plain, XLA; XLA, plain; ...), each read as examples/s, and `readings.compare` decides
from `timing.ROUNDS` rounds on: a 95 % interval that separates them keeps the faster,
`timing.MAX_ROUNDS` rounds without one keep the plain step ("no measurable difference":
the simpler). The rest of the run keeps the winner. An XLA step that does not compile is
dropped at its first loop (that loop's batches train the plain step instead). XLA is not
compiled at all when the plain step's first loops project its compilation over
`timing.PROBE_SHARE` of the first epoch (the plain step's tracing stands in for it, as in
`timing.admit`): the plain step's warm-up and first reading come before XLA's.

`Alternation` is the decision alone (no TensorFlow): which candidate runs the next loop,
what a loop read, and the `XlaChoice` it makes. The Runner runs the loops
(`tfaccel.train.step.runner.Runner.alternate_xla`).

Example:
    >>> ab = Alternation()
    >>> [ab.next() for _ in range(1)]
    ['plain step']
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tfaccel.choices import readings, timing
from tfaccel.choices.xla import XlaChoice

PLAIN, XLA = "plain step", "XLA"
CANDIDATES = (PLAIN, XLA)  # the simplest first: kept when nothing separates them


def loop_seconds(candidate: str, seconds: float, steps: int) -> float:
    """The seconds a loop of `candidate` (`steps` steps) is read at: as measured (a
    test plants its own here)."""
    del candidate, steps
    return seconds


class _NeedMore(Exception):
    """`compare` asked for another round: the online readings have none yet."""


def _more(candidate: str) -> float:
    raise _NeedMore(candidate)


class Alternation:
    """The online A/B of the plain and the XLA step (see the module's docstring).

    Args:
        min_rounds: paired rounds read before `compare` judges.
        max_rounds: rounds after which the plain step is kept undecided.
        settle: maps this worker's "stop" to the one every worker acts on (a multi-worker
            job must alternate alike on every worker); None: one worker.
    """

    def __init__(
        self,
        min_rounds: int = timing.ROUNDS,
        max_rounds: int = timing.MAX_ROUNDS,
        settle: Callable[[bool], bool] | None = None,
        epoch_steps: int | None = None,
    ) -> None:
        self.min_rounds, self.max_rounds, self.settle = min_rounds, max_rounds, settle
        self.epoch_steps = epoch_steps
        self._warm_s = 0.0  # the plain step's first loop: its tracing
        self.readings: dict[str, list[float]] = {c: [] for c in CANDIDATES}
        self.warmed: list[str] = []
        self.loops = 0
        self.seconds = 0.0
        self.verdict: readings.Comparison | None = None
        self.dropped: str | None = None

    @property
    def decided(self) -> bool:
        """Whether the rest of the run keeps one step (`jit_compile`)."""
        return self.verdict is not None or self.dropped is not None

    @property
    def jit_compile(self) -> bool:
        """The winner once decided (until then: whether the next loop is XLA's)."""
        if self.dropped is not None:
            return False
        if self.verdict is not None:
            return self.verdict.chosen == XLA
        return self.next() == XLA

    def next(self) -> str:
        """The candidate of the next loop: each one's first (warm-up), then interleaved
        rounds in `compare`'s order (round r reversed when r is odd)."""
        if PLAIN not in self.warmed or not self.readings[PLAIN]:
            return PLAIN  # its warm-up, then one reading: what XLA's compilation would cost
        if XLA not in self.warmed:
            return XLA
        rounds = min(len(r) for r in self.readings.values())
        order = CANDIDATES if rounds % 2 == 0 else CANDIDATES[::-1]
        return next(c for c in order if len(self.readings[c]) <= rounds)

    def record(self, candidate: str, examples: float, seconds: float, steps: int) -> bool:
        """Reads one loop of `candidate`; True when this reading decided the A/B."""
        self.loops += 1
        self.seconds += seconds
        if self.decided:
            return False
        if candidate not in self.warmed:  # tracing / compiling: not read
            self.warmed.append(candidate)
            self._warm_s = seconds if candidate == PLAIN else self._warm_s
            return False
        seconds = loop_seconds(candidate, seconds, steps)
        self.readings[candidate].append(examples / max(seconds, 1e-12))
        if candidate == PLAIN and len(self.readings[PLAIN]) == 1:
            why = self._declined(seconds / max(steps, 1))
            if self.settle(why is not None) if self.settle is not None else why is not None:
                self.dropped = why or "declined: another worker's first loops project more"
                return True
        counts = {len(r) for r in self.readings.values()}
        if len(counts) > 1 or min(counts) < self.min_rounds:
            return False
        try:
            self.verdict = readings.compare(
                _more, CANDIDATES, prior=self.readings, min_rounds=self.min_rounds,
                max_rounds=self.max_rounds, settle=self.settle,
            )  # fmt: skip
        except _NeedMore:
            return False
        return True

    def _declined(self, step_s: float) -> str | None:
        """Why XLA is not compiled (None: it is): the plain step's tracing, which XLA's
        compilation takes at least as long as (`timing.admit`), over `PROBE_SHARE` of
        the first epoch's projected time."""
        trace = max(self._warm_s - step_s, 0.0)  # its first loop less about one step
        epoch = self.epoch_steps or 0
        if step_s <= 0 or not epoch or trace <= timing.PROBE_SHARE * epoch * step_s:
            return None
        needed = math.ceil(trace / (timing.PROBE_SHARE * step_s))
        return (
            f"declined: the plain step's tracing ({trace:.2g} s) projects an XLA compilation "
            f"over {timing.PROBE_SHARE:.0%} of the first epoch ({epoch} steps of "
            f"{step_s * 1e3:.3g} ms); from {needed:,} steps an epoch up it is tried"
        )

    def drop(self, why: str) -> None:
        """XLA cannot run here (`why`): the plain step is kept."""
        self.dropped = why

    def choice(self) -> XlaChoice:
        """The `XlaChoice` so far: chosen online with the figures and the loops it took."""
        took = f"{self.loops} loop(s)"
        if self.dropped is not None:
            return XlaChoice(False, f"chosen online after {took}: {self.dropped}", online=True)
        if self.verdict is None:
            return XlaChoice(
                self.jit_compile, f"being chosen online: {took} of the A/B so far", online=True
            )
        means = self.verdict.means
        figures = {"plain": means[PLAIN], "XLA": means[XLA]}
        reason = (
            f"chosen online over the first {took} (plain and XLA steps alternated, each "
            f"one's first loop not read): {self.verdict.reason}"
        )
        return XlaChoice(self.verdict.chosen == XLA, reason, figures, online=True)
