"""The range test declines at its first timed steps when its ramp cannot fit the bound.

After the first step (it traces) and `TIMED` more, the ramp's end is projected at the
fastest step measured. Past `budget_s` (`tune` passes what is left of its share), or,
given the job's size, past `budget.PROBE_SHARE` (10 %) of the job's time at that step,
the test stops at once, rather than spending the bound on a ramp cut short or on a job
it cannot pay for, and says from what budget or job size it would run.
"""

from __future__ import annotations

import math

from tfaccel.tuning.batch.budget import PROBE_SHARE

TIMED = 2  # timed steps after the first before the projection


def project(
    elapsed: float,
    done: int,
    step_s: float,
    num_steps: int,
    budget_s: float | None,
    job_steps: int | None = None,
    batch: int | None = None,
) -> str | None:
    """Why the ramp declines after `done` steps and `elapsed` s at `step_s` a step; None
    when it fits in `budget_s` and in `PROBE_SHARE` of a job of `job_steps` of `batch`."""
    projected = elapsed + (num_steps - done) * step_s
    ran = f"declined after {done} steps ({elapsed:.2g} s"
    ramp = f"the ramp of {num_steps} steps projects {projected:.2g} s"
    if budget_s is not None and projected > budget_s:
        return (
            f"{ran}): {ramp}, past budget_s={budget_s:.2g}; from budget_s={projected:.2g} up "
            "it runs"
        )
    if job_steps and batch and step_s > 0 and projected > PROBE_SHARE * job_steps * step_s:
        job_s = job_steps * step_s
        threshold = math.ceil(projected / (PROBE_SHARE * step_s)) * batch
        return (
            f"{ran}, {elapsed / job_s:.1%} of the job's {job_s:.2g} s): {ramp}, past "
            f"{PROBE_SHARE:.0%} of the job; from {threshold:,} examples up it runs"
        )
    return None
