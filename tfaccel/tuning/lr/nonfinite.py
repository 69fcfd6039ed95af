"""A non-finite loss in a range test: the rate diverging, or a non-finite input.

A diverging rate makes the loss climb before it overflows; a NaN or Inf in one batch's
inputs or labels turns a loss near its lowest into NaN in one step. The range test names
the second "non-finite input" and gives no suggestion (the curve was cut by the data).
"""

from __future__ import annotations

import math

import numpy as np

INPUT = "non-finite input"
JUMP = 3.0  # a loss within 3x the lowest median of 5 has not started to climb
RECENT = 5


def cause(losses: list[float]) -> str:
    """ "diverged" or "non-finite input", for a ramp whose last loss is not finite."""
    finite = [x for x in losses[:-1] if math.isfinite(x)]
    if len(finite) < RECENT:
        return "diverged"
    best = min(float(np.median(finite[i - RECENT : i])) for i in range(RECENT, len(finite) + 1))
    return INPUT if best > 0 and finite[-1] <= JUMP * best else "diverged"


def reason(rates: list[float], losses: list[float]) -> str:
    """Why no rate is suggested after a non-finite input."""
    last = next(x for x in reversed(losses) if math.isfinite(x))
    return (
        f"the loss turned non-finite at step {len(losses)} (rate {rates[-1]:.3g}) straight "
        f"after a finite loss of {last:.4g}, near its lowest: the rate was not diverging, "
        "a batch holds a non-finite input or label (NaN or Inf). Check the data "
        "(tfaccel.data.check) and run the range test again"
    )
