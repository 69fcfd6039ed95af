"""The Runner's part of `jit_compile="auto"` chosen online (`tfaccel.choices.online`):
the plain and the XLA step loops, switched loop by loop until the A/B decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfaccel.choices.agreement import agree, is_multi_worker
from tfaccel.choices.online import Alternation


class Alternating:
    """What `runner.Runner` adds to alternate its step loops (a base class of it)."""

    strategy: Any
    loops: Any
    jit_compile: bool
    micro_batches: int
    alternation: Alternation | None
    _candidates: dict[bool, Any]  # the A/B's step loops by jit_compile
    _table: dict | None  # the settings table the A/B's row goes to
    _ready: Callable[[], bool] | None = None  # whether the A/B may run its next loop

    def _step_loops(self, micro_batches: int) -> Any:
        raise NotImplementedError

    def alternate_xla(
        self,
        table: dict | None = None,
        ready: Callable[[], bool] | None = None,
        epoch_steps: int | None = None,
    ) -> None:
        """`jit_compile="auto"` chosen online (`tfaccel.choices.online`): the next loops
        alternate the plain and the XLA step until the readings decide, then the winner
        runs on; `table["jit_compile"]` (the settings table's row) says what was chosen.
        It starts once `ready()` (the loop size is settled: loops of one size are
        compared); `epoch_steps` bounds XLA's compilation (`Alternation`). Once per
        runner: a later fit keeps the A/B's state."""
        if self.alternation is None:
            strategy = self.strategy
            agreed = lambda stop: not agree(strategy, float(not stop))  # noqa: E731
            settle = agreed if is_multi_worker(strategy) else None
            self.alternation = Alternation(settle=settle, epoch_steps=epoch_steps)
        self._table, self._ready = table, ready

    def _alternating(self) -> Alternation | None:
        """The A/B, while it runs its next loop (None: none, not ready, or decided)."""
        ab = self.alternation
        if ab is None or ab.decided or (self._ready is not None and not self._ready()):
            return None
        return ab

    def _use(self, jit_compile: bool) -> None:
        """Runs the step loops with or without XLA from the next loop on (made once each)."""
        if jit_compile != self.jit_compile and self.loops is not None:
            self._candidates[self.jit_compile] = self.loops
            self.jit_compile = jit_compile
            made = self._candidates.get(jit_compile)
            self.loops = made if made is not None else self._step_loops(self.micro_batches)

    def _read_alternation(
        self, ab: Alternation, candidate: str, ran: int, examples: float, seconds: float
    ) -> None:
        """Gives the A/B a loop's reading (the slowest worker's: every worker decides
        alike); once decided, the winner runs on and the table's row says so."""
        if ab.record(candidate, examples, agree(self.strategy, seconds), ran) or ab.decided:
            self._use(ab.jit_compile)
            self._candidates = {}
        if self._table is not None:
            self._table["jit_compile"] = ab.choice().describe()
