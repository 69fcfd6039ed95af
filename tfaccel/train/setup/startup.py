"""Where a `fit`'s start-up went: from the call to the end of its first step loop, by phase.

`Trainer.fit` keeps one `Startup` per call (`trainer.startup`, `history.startup`): a lap
clock whose phases are charged in order, so they sum to the total exactly. The traces of
the step loops (`tfaccel.train.step.traces`) that happen inside a phase are carved out of
it as phases of their own ("trace: train loop"). The first step loop's phase holds the
rest of that call: the graph's optimisation and the first steps themselves.

Example:
    >>> history = trainer.fit(x, y, epochs=3)                       # doctest: +SKIP
    >>> print(trainer.startup)                                       # doctest: +SKIP
    >>> trainer.startup.phases["label contract"]                     # doctest: +SKIP
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import keras

from tfaccel.train.step import traces

if TYPE_CHECKING:
    from tfaccel.data import Feed
    from tfaccel.train.state.policies import Checkpointing

FIRST_STEP = "first step loop"
_OPEN: list[Startup] = []  # clocks still counting traces (a fit that raised never closed its own)


class Clock(Protocol):
    """What a phase of the start-up laps: a `Startup` in `fit`, `IDLE` outside it."""

    def lap(self, name: str) -> None: ...


class Startup:
    """A lap clock over one `fit`'s start-up; see the module docstring.

    Attributes:
        phases: phase name → seconds, in the order first charged.
        total: seconds from the `fit` call to the end of the first step loop (0.0 until then).
        traces: loop name → traces made during this `fit` (until it ends).
        done: whether the first step loop has ended.
    """

    def __init__(self, verbose: int | str = 0) -> None:
        self.phases: dict[str, float] = {}
        self.total = 0.0
        self.traces: dict[str, int] = {}
        self.done = False
        self.verbose = verbose
        self._began = self._last = time.perf_counter()
        self._traced: collections.defaultdict[str, float] = collections.defaultdict(float)
        while _OPEN:
            _OPEN.pop().close()
        self._stop = traces.listen(self._on_trace)
        _OPEN.append(self)

    def _on_trace(self, name: str, seconds: float) -> None:
        self.traces[name] = self.traces.get(name, 0) + 1
        if not self.done:
            self._traced[name] += seconds

    def lap(self, name: str) -> None:
        """Charges the time since the last lap to `name` (less the traces made meanwhile)."""
        if self.done:
            return
        now = time.perf_counter()
        spent = now - self._last
        for loop, seconds in self._traced.items():
            self._charge(f"trace: {loop}", seconds)
            spent -= seconds
        self._traced.clear()
        self._charge(name, max(spent, 0.0))
        self._last = now

    def _charge(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def finish(self) -> None:
        """The first step loop ended: the last lap, and the total."""
        if self.done:
            return
        self.lap(FIRST_STEP)
        self.done = True
        self.total = self._last - self._began
        if self.verbose == 2:
            print(self)

    def close(self) -> None:
        """`fit` ended: stops counting traces."""
        self._stop()
        if self in _OPEN:
            _OPEN.remove(self)

    def to_dict(self) -> dict[str, Any]:
        """`{"total_s", "phases_s", "traces"}` (plain numbers, for JSON)."""
        return {
            "total_s": round(self.total, 4),
            "phases_s": {name: round(s, 4) for name, s in self.phases.items()},
            "traces": dict(self.traces),
        }

    def summary(self) -> str:
        """One line for the settings table: the total and the largest phase."""
        if not self.phases:
            return "not measured (no step ran)"
        name, seconds = max(self.phases.items(), key=lambda item: item[1])
        return f"{self.total:.2f} s to the first step loop (largest: {name}, {seconds:.2f} s)"

    def __str__(self) -> str:
        width = max([len(name) for name in self.phases] + [5])
        lines = ["tfaccel.Trainer start-up (fit call → end of the first step loop)"]
        lines.append("-" * (width + 22))
        for name, seconds in self.phases.items():
            share = seconds / self.total if self.total > 0 else 0.0
            lines.append(f"{name:<{width}}  {seconds:8.3f} s  {share:6.1%}")
        lines.append(f"{'total':<{width}}  {self.total:8.3f} s")
        return "\n".join(lines)


class FirstStep(keras.callbacks.Callback):
    """Ends the start-up's laps: the restore at `on_train_begin`, the first step loop at
    its `on_train_batch_end`. Per-loop hooks suffice (it does not cap the loop size)."""

    loop_batches_ok = True

    def __init__(self, startup: Startup) -> None:
        super().__init__()
        self.startup = startup

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.startup.lap("checkpoint restore and input iterator")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.startup.finish()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        history = getattr(self.model, "history", None)
        if history is not None:
            history.startup = self.startup
        self.startup.close()


def before_loop(
    clock: Startup,
    feed: Feed,
    checkpointing: Checkpointing,
    callbacks: Sequence[keras.callbacks.Callback],
) -> list[keras.callbacks.Callback]:
    """Laps the inputs' checks; with checkpoints reads the training data's fingerprint
    (its own phase: the checkpoint compares it with the saved run's); returns `callbacks`
    with the `FirstStep` that ends the start-up."""
    if checkpointing.enabled:
        feed.fingerprint  # noqa: B018 - computed once, kept by the Feed
        clock.lap("fingerprint")
    return [*callbacks, FirstStep(clock)]


class _Idle:
    """The clock outside `fit` (`Trainer.feed`, `evaluate`): laps cost nothing."""

    def lap(self, name: str) -> None:
        del name


IDLE: Clock = _Idle()
