"""The step probe: the model's forward and backward passes timed on one cached batch,
under each candidate setting (a dtype policy, with or without XLA), and whether the job
is long enough to pay for it.

Copies of the model (`copies.under`) run `passes.GradientLoops` on one cached batch of the
training data, after a warm-up, in alternating rounds (the fastest call counts: noise only
slows a call down); the optimizer's update is float32 under every policy, so it is left
out. Nothing of the user's run moves: the copies are thrown away, the data is read through
its own iterator, and Python's, NumPy's and TensorFlow's global random states are put back.
The timed rounds stay within `SHARE` of an epoch (at least `FLOOR_S`). On a multi-worker
job every size and reading goes through `agreement.agree`, so that every worker runs the
same calls and makes the same choice.

What the probe costs decides whether it runs. Timing policies runs at least
`probe_steps(n)` steps of the model's passes (a warm-up of two calls and `ROUNDS` timed
calls per candidate), while the most a candidate can save is `1 - 1/gain` of every
training step, the gain bounded by the operations' rates (`policy.choose`, once per
machine; a whole step gains less): a job of fewer steps than `probe_steps(n) / (1 -
1/gain)` is `too_short` (the mixed-precision guide's dense model, scaled to this CPU: a
14.9 s probe for a 12-step job; bfloat16's operations 2.36x float32's, its training steps
about 2x). XLA's compilation is the probe's big cost, so with XLA candidates the whole
probe is bounded by `SHARE` of the job (epochs × steps): it is not run when its least cost
(`PROBE_STEPS` steps per candidate) could not fit (`too_short_for_xla`), nor when the plain
steps' first readings project more (`admit`: their tracing stands in for the compilation,
which takes at least as long).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfaccel.choices import passes, policy
from tfaccel.choices.agreement import agree
from tfaccel.choices.copies import build_symbolically, random_states_kept, under
from tfaccel.choices.passes import GradientLoops
from tfaccel.choices.policy import PolicyChoice
from tfaccel.data import iterators

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfaccel.data.assembly.feed import Feed

SHARE = 0.05  # the timed rounds' cost: at most this share of one epoch (with XLA, of the job)
ROUNDS = 3
FLOOR_S = 1.0  # ... but never less than this (a short epoch still gets a reading)
PROBE_STEPS = 2 + ROUNDS  # per candidate, at least: warm-up and timed rounds


def probe_steps(candidates: int) -> int:
    """The fewest steps of the passes the probe runs: warm-up (2) and timed rounds."""
    return candidates * PROBE_STEPS


def too_short(
    policies: list[str], job_steps: int | None, ops: PolicyChoice | None = None
) -> str | None:
    """Why timing `policies` on a job of `job_steps` steps cannot pay (None: it may), from
    the operations' rates `ops` (`policy.operations_choice`; default this machine's, once
    per machine, cached).

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


def too_short_for_xla(steps: int | None, policies: int) -> str | None:
    """Why a job of `steps` steps is not probed with XLA candidates (None: it is): its
    length unknown, or the least probe (compilation included) over `SHARE` of it."""
    if steps is None:
        return "the job's length is unknown (pass steps_per_epoch)"
    least = 2 * probe_steps(policies)
    if steps * SHARE < least:
        return (
            f"a job of {steps} steps is too short: the probe takes at least {least} steps and "
            f"XLA's compilation, more than {SHARE:.0%} of it; from {math.ceil(least / SHARE)} "
            "steps up it is measured"
        )
    return None


def admit(first: dict, steps: int, epoch_steps: int | None, spent_s: float) -> str | None:
    """Why the jitted candidates are not compiled, from the plain ones' first readings
    ({candidate: (first call s, step s)}): the probe they project exceeds `SHARE` of the
    job. None: compile them."""
    step_s = next(iter(first.values()))[1]
    traces = sum(max(call - step, 0.0) for call, step in first.values())  # ~ the compiles
    rounds = max(SHARE * step_s * (epoch_steps or 0), FLOOR_S)
    rounds = max(rounds, ROUNDS * 2 * len(first) * step_s)
    projected = spent_s + traces + 2 * len(first) * step_s + rounds  # + the jitted warm-ups
    if step_s <= 0 or projected <= SHARE * steps * step_s:
        return None
    threshold = math.ceil(projected / (SHARE * step_s))
    return (
        f"declined: the first readings project a probe of {projected:.2g} s, more than "
        f"{SHARE:.0%} of the job ({steps} steps of {step_s * 1e3:.3g} ms); from "
        f"{threshold:,} steps up it is measured"
    )


def time_policies(
    model: keras.Model,
    loss: Callable[..., Any],
    strategy: tf.distribute.Strategy,
    feed: Feed,
    policies: Sequence[str],
    *,
    builder: Callable | None = None,
    epoch_steps: int | None = None,
) -> dict:
    """Examples/s of the passes under each policy, and what the measurement cost.

    The first policy is the reference: the timed rounds stay within `SHARE` of an epoch
    of `epoch_steps` of its passes (at least `FLOOR_S`).

    Returns `{"rates": {policy: examples/s}, "steps": steps per timed call, "rounds",
    "seconds": the whole probe, "timed_s": the timed rounds, "budget_s"}`.
    """
    steps = [(p, False) for p in policies]
    measured = time_steps(
        model, loss, strategy, feed, steps, builder=builder, epoch_steps=epoch_steps
    )
    measured["rates"] = {p: measured["rates"][(p, False)] for p in policies}
    return measured


def time_steps(
    model: keras.Model,
    loss: Callable[..., Any],
    strategy: tf.distribute.Strategy,
    feed: Feed,
    candidates: Sequence[tuple[str, bool]],
    *,
    builder: Callable | None = None,
    epoch_steps: int | None = None,
    admit: Callable[[dict], str | None] | None = None,
) -> dict:
    """Examples/s of each candidate step `(policy, jit_compile)`, and what it cost.

    The model is built on the feed's spec first if it is not (its variables in the
    strategy's scope). The first candidate (un-jitted) is the reference of the timed
    rounds' budget, as in `time_policies`. The un-jitted candidates warm up first; then
    `admit(readings)` ({candidate: (first call s, one step s)}) may return why the jitted
    ones are not worth compiling; one XLA cannot compile is dropped with the reason. Where
    a jitted candidate remains, each candidate's loss on the cached batch is read
    (inference mode).

    Returns `time_policies`' dict keyed by candidate, with `"losses"` and `"dropped"`
    ({candidate: why it was not timed}).

    Raises:
        ValueError: the model cannot be built or copied (the message says what to pass).
    """
    began = time.perf_counter()
    batch = feed.global_batch
    with random_states_kept(), strategy.scope():
        if not model.built or not model.weights:
            build_symbolically(model, feed.element_spec[0])
        copies = {p: under(model, p, builder) for p in dict.fromkeys(p for p, _ in candidates)}
        cached = iterators.adopt(iter(feed.one_batch().distribute(endless=True)))
        loops = {c: GradientLoops(copies[c[0]], loss, strategy, c[1]) for c in candidates}
        first, dropped = passes.warm_up(loops, cached, admit, strategy)
        live = [c for c in candidates if c in first]
        budget = max(SHARE * first[live[0]][1] * (epoch_steps or 0), FLOOR_S)
        per_call = budget / (ROUNDS * len(live))
        slowest = max(step for _, step in first.values())
        steps = int(agree(strategy, max(1, min(round(per_call / slowest), 1000))))
        best = dict.fromkeys(live, float("inf"))
        timed = time.perf_counter()
        for r in range(ROUNDS):
            for c in live if r % 2 == 0 else list(reversed(live)):
                best[c] = min(best[c], loops[c].seconds(False, cached, steps, 1)[0])
        timed_s = time.perf_counter() - timed
        best = {c: agree(strategy, s) for c, s in best.items()}  # the slowest worker's: one choice
        jitted = any(jit for _, jit in live)
        losses = {c: loops[c].loss_once(cached) for c in live} if jitted else {}
    del cached, loops, copies
    return {
        "rates": {c: (batch or 1) * steps / best[c] for c in live},
        "losses": losses,
        "dropped": dropped,
        "steps": steps,
        "rounds": ROUNDS,
        "seconds": time.perf_counter() - began,
        "timed_s": timed_s,
        "budget_s": budget,
    }


def described(measured: dict) -> str:
    """What a measurement timed, for a choice's reason."""
    return (
        f"the model's passes, {measured['rounds']} rounds of {measured['steps']} step(s); "
        f"probe {measured['seconds']:.1f} s"
    )
