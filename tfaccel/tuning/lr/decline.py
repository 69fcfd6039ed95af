"""The range test declines at its first timed steps when its ramp cannot fit `budget_s`.

After the first step (it traces) and `TIMED` more, the ramp's end is projected at the
fastest step measured; past `budget_s` (`tune` passes what is left of its share of the
job), the test stops at once, rather than spending the budget on a ramp cut short, and
says from what budget it would run.
"""

from __future__ import annotations

TIMED = 2  # timed steps after the first before the projection


def project(
    elapsed: float, done: int, step_s: float, num_steps: int, budget_s: float | None
) -> str | None:
    """Why the ramp declines after `done` steps and `elapsed` s at `step_s` a step; None
    when it fits in `budget_s` (or there is none)."""
    projected = elapsed + (num_steps - done) * step_s
    if budget_s is None or projected <= budget_s:
        return None
    return (
        f"declined after {done} steps ({elapsed:.2g} s): the ramp of {num_steps} steps "
        f"projects {projected:.2g} s, past budget_s={budget_s:.2g}; from "
        f"budget_s={projected:.2g} up it runs"
    )
