"""`Trainer(..., precision="auto")`: the dtype policy chosen on the model's own step.

"auto" times the forward and backward passes of each candidate copy on one cached
batch of the training data (`timing`); `policy.decide` keeps float32 unless another
policy is 5 % faster.

The probe pays only when the job is long enough to earn it back: it runs at least
`probe_steps(n)` steps of the model's passes (a warm-up of two calls and `ROUNDS` timed
calls per candidate), while the most a candidate can save is `1 - 1/gain` of every
training step, the gain bounded by the operations' rates that `policy.choose` measured
once per machine (matmuls and a convolution, cached in a file; a whole step gains less).
A job of fewer steps than `probe_steps(n) / (1 - 1/gain)` times nothing of the model: it
takes the operations' pick when that is `RULE_GAIN` (1.5x) float32's or more, else
keeps the model's policy, with the reason (the mixed-precision guide's dense model,
scaled to this CPU: a 14.9 s probe for a 12-step job; bfloat16's operations 2.36x
float32's, its training steps about 2x). On a multi-worker job the workers decide from the
same rates (`operations_choice`): each worker's own reading, or one read from the cache
while another measured, would let one time the model (collectives the others never call)
or copy it under another policy.
"""

from __future__ import annotations

import dataclasses
import math

from tfaccel.choices import policy, timing
from tfaccel.choices.agreement import agree, is_multi_worker
from tfaccel.choices.policy import PolicyChoice

ROUNDS = timing.ROUNDS
RULE_GAIN = 1.5  # a job too short to time: the operations' pick when this much faster


def probe_steps(candidates: int) -> int:
    """The fewest steps of the passes the probe runs: warm-up (2) and timed rounds."""
    return candidates * (2 + ROUNDS)


def operations_choice(strategy=None) -> PolicyChoice:
    """`policy.choose()` (the operations' rates, once per machine); on a multi-worker
    job every rate is agreed first (the largest any worker read), so that every worker
    makes the same decisions from them."""
    ops = policy.choose()
    if strategy is None or not ops.rates or not is_multi_worker(strategy):
        return ops
    rates = {p: agree(strategy, r) for p, r in sorted(ops.rates.items())}
    what = "the operations' rates, each the largest any worker read"
    return dataclasses.replace(policy.decide(rates, ops.unit, what), source=ops.source)


def by_operations(kept: str, short: str, ops: PolicyChoice | None = None) -> PolicyChoice:
    """A job too short to time the model: the operations' pick (`ops`, default this
    machine's) when it is `RULE_GAIN` times float32's or more (a whole step gains less
    than its matmuls), else `kept`."""
    ops = ops or policy.choose()
    gain = ops.rates.get(ops.policy, 0.0) / ops.rates.get("float32", float("inf"))
    if ops.policy != "float32" and gain >= RULE_GAIN:
        return PolicyChoice(
            ops.policy,
            f"by the operations' rates, {gain:.2f}x float32's (>= {RULE_GAIN}x), not timed "
            f"on the model: {short}" + (f"; the operations' {ops.source}" if ops.source else ""),
            dict(ops.rates),
            ops.unit,
        )
    return PolicyChoice(kept, f"kept: not measured ({short})")


def too_short(
    policies: list[str], job_steps: int | None, ops: PolicyChoice | None = None
) -> str | None:
    """Why timing `policies` on a job of `job_steps` steps cannot pay (None: it may), from
    the operations' rates (`ops`, default this machine's: once per machine, cached).

    Unknown length, or operations' rates not measured (hypothetical hardware): None.
    """
    if job_steps is None or len(policies) < 2:
        return None
    rates = (ops or policy.choose()).rates
    if "float32" not in rates or rates["float32"] <= 0:
        return None
    gain = max(rates.get(p, 0.0) for p in policies if p != "float32") / rates["float32"]
    least = probe_steps(len(policies))
    if gain > 1 and job_steps * (1 - 1 / gain) >= least:
        return None
    best = f"the candidates' operations at most {gain:.2f}x float32's"
    if gain <= 1:
        return f"{best}: no step can gain what the probe's {least} steps cost"
    needed = math.ceil(least / (1 - 1 / gain))
    return (
        f"a job of {job_steps} steps is too short: {best} save at most "
        f"{1 - 1 / gain:.0%} of each step, less than the probe's {least} steps; from "
        f"{needed:,} steps up it is measured"
    )


def choose(
    model, loss, strategy, feed, *, builder=None, epoch_steps=None, job_steps=None
) -> PolicyChoice:
    """The policy for this model's step on this machine ("auto"), with what was measured;
    the model's own policy, not measured, when a job of `job_steps` is `too_short`."""
    policies, why = policy.candidates()
    if len(policies) == 1:
        return PolicyChoice("float32", why)
    ops = operations_choice(strategy) if job_steps is not None else None
    short = too_short(policies, job_steps, ops)
    if short:
        return by_operations(model.dtype_policy.name, short, ops)
    measured = timing.time_policies(
        model, loss, strategy, feed, policies, builder=builder, epoch_steps=epoch_steps
    )
    what = (
        f"the model's passes, {measured['rounds']} rounds of {measured['steps']} step(s); "
        f"probe {measured['seconds']:.1f} s"
    )
    choice = policy.decide(measured["rates"], "examples/s", what)
    return dataclasses.replace(choice, cost_s=measured["seconds"])
