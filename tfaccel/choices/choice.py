"""The one protocol of tfaccel's measured choices: a value, why, what was measured, its cost.

Every automatic setting tfaccel decides by measuring — the dtype policy (`policy`), XLA
(`xla`), steps per loop (`loop_size`) and the operations' rates behind them (`operations`)
— answers with a `Choice`, and the settings table prints its `describe()`. The named kinds
add only a name for the value (`PolicyChoice.policy`, `XlaChoice.jit_compile`) and for the
figures (`rates`).

Example:
    >>> Choice(3, "fixed by the user").describe()
    '3 (fixed by the user)'
    >>> Choice("mixed_bfloat16", "2.00x float32", {"float32": 100.0,
    ...        "mixed_bfloat16": 200.0}, "examples/s").describe()
    'mixed_bfloat16 (2.00x float32; float32 100 examples/s, mixed_bfloat16 200 examples/s)'
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Choice:
    """A measured choice.

    Attributes:
        value: what was chosen (a policy name, True / False, a number of steps).
        reason: why, in words (what was measured, or why nothing was).
        figures: what was measured, by name (each candidate's rate); empty when nothing
            was. Listed by `describe` when they share a `unit`; figures of several kinds
            (an overhead and a step time) are stated by the reason instead.
        unit: the figures' unit ("examples/s", "FLOP/s"), "" when they have none in common.
        cost_s: what measuring took, in seconds (tracing and compilation included).
        source: where figures not measured by this process come from (a cache file).
    """

    value: Any
    reason: str
    figures: dict = dataclasses.field(default_factory=dict)
    unit: str = ""
    cost_s: float = 0.0
    source: str = ""

    def describe(self) -> str:
        """One line for a settings table: the value, why, and the figures in their unit."""
        if not self.figures or not self.unit:
            return f"{self.value} ({self.reason})"
        figures = ", ".join(f"{k} {v:,.4g} {self.unit}" for k, v in self.figures.items())
        return f"{self.value} ({self.reason}; {figures})"

    @property
    def rates(self) -> dict:
        """The figures, under the name the rate-measuring choices have always used."""
        return self.figures
