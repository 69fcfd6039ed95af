"""The step probe: the model's forward and backward passes timed on one cached batch,
under each candidate setting (a dtype policy, with or without XLA), and whether the job
is long enough to pay for it.

Copies of the model (`copies.under`) run `passes.GradientLoops` on one cached batch of the
training data, after a warm-up, in alternating rounds (the fastest call counts: noise only
slows a call down); the optimizer's update is float32 under every policy, so it is left
out. Nothing of the user's run moves: the copies are thrown away, the data is read through
its own iterator, and Python's, NumPy's and TensorFlow's global random states are put back.
The timed rounds stay within `SHARE` of the first epoch (`FLOOR_S` when its length is
unknown). On a multi-worker
job every size and reading goes through `agreement.agree`, so that every worker runs the
same calls and makes the same choice.

What the probe costs decides whether it runs, bounded by the *first* epoch's projected
time, not the declared epochs (a script declaring 150 epochs and relying on EarlyStopping
reached its target in 6-8: a probe sized to 150 spent 3.0 s, 74 % of its start-up, on
XLA). Timing policies runs at least `probe_steps(n)` steps of the model's passes (a
warm-up of two calls and `ROUNDS` timed calls per candidate), while the most a candidate
can save is `1 - 1/gain` of every training step, the gain bounded by the operations' rates
(`policy.choose`, once per machine; a whole step gains less): a first epoch of fewer steps
than `probe_steps(n) / (1 - 1/gain)` is `too_short` (the mixed-precision guide's dense
model, scaled to this CPU: a 14.9 s probe for a 12-step job; bfloat16's operations 2.36x
float32's, its training steps about 2x). XLA's compilation is the probe's big cost, so
with XLA candidates the whole probe is bounded by `PROBE_SHARE` of the first epoch: it is
not run when its least cost (`PROBE_STEPS` steps per candidate, twice) could not fit
(`too_short_for_xla`), nor when the plain steps' first readings project more (`admit`:
their tracing stands in for the compilation, which takes at least as long).

The timed rounds compare the candidates under noise (`readings.compare`): interleaved
rounds from `ROUNDS` up to `MAX_ROUNDS`, until the fastest is separated within a 95 %
interval or the rounds' budget is spent; `tied` then says "no measurable difference"
and the deciders keep the simpler setting (float32, the plain step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfaccel.choices import passes, policy, readings
from tfaccel.choices.agreement import agree
from tfaccel.choices.copies import build_symbolically, random_states_kept, under
from tfaccel.choices.passes import GradientLoops
from tfaccel.choices.policy import PolicyChoice
from tfaccel.data import iterators

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfaccel.data.assembly.feed import Feed

SHARE = 0.05  # the timed rounds' cost: at most this share of the first epoch
PROBE_SHARE = 0.1  # with XLA, the whole probe: at most this share of the first epoch
ROUNDS = 3  # interleaved rounds read before judging
MAX_ROUNDS = 2 * ROUNDS  # ... and at most this many, within the rounds' budget
FLOOR_S = 1.0  # the timed rounds' budget when the epoch's length is unknown
PROBE_STEPS = 2 + ROUNDS  # per candidate, at least: warm-up and timed rounds
ONLINE_LOOPS = 2 * (1 + MAX_ROUNDS)  # the online A/B's most loops: warm-ups, rounds
SLOWER = 4.0  # a candidate whose warmed step takes this many times the reference's: not timed


def probe_steps(candidates: int) -> int:
    """The fewest steps of the passes the probe runs: warm-up (2) and timed rounds."""
    return candidates * PROBE_STEPS


def too_short(
    policies: list[str], job_steps: int | None, ops: PolicyChoice | None = None
) -> str | None:
    """Why timing `policies` cannot pay within a first epoch of `job_steps` steps (None: it
    may), from the operations' rates `ops` (`policy.operations_choice`; default this
    machine's, once per machine, cached).

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
        f"a first epoch of {job_steps} steps is too short: {best} save at most "
        f"{1 - 1 / gain:.0%} of each step, less than the probe's {least} steps; from "
        f"{needed:,} steps up it is measured"
    )


def too_short_for_xla(steps: int | None, policies: int) -> str | None:
    """Why a first epoch of `steps` steps is not probed with XLA candidates (None: it
    is): its length unknown, or the least probe (compilation included) over
    `PROBE_SHARE` of it."""
    if steps is None:
        return "the job's length is unknown (pass steps_per_epoch)"
    least = 2 * probe_steps(policies)
    if steps * PROBE_SHARE < least:
        return (
            f"a first epoch of {steps} steps is too short: the probe takes at least {least} "
            f"steps and XLA's compilation, more than {PROBE_SHARE:.0%} of it; from "
            f"{math.ceil(least / PROBE_SHARE)} steps an epoch up it is measured"
        )
    return None


def online_fits(epoch_steps: int | None, loop_steps: int | None) -> bool:
    """Whether XLA is chosen online (`online`): the first epoch is long enough for a
    probe of XLA alone (`too_short_for_xla`), and holds `ONLINE_LOOPS` loops where their
    size is fixed (`loop_steps`; None: "auto", whose loops start short)."""
    if epoch_steps is None or too_short_for_xla(epoch_steps, 1) is not None:
        return False
    return loop_steps is None or epoch_steps // max(loop_steps, 1) >= ONLINE_LOOPS


def admit(first: dict, epoch_steps: int | None, spent_s: float) -> str | None:
    """Why the jitted candidates are not compiled, from the plain ones' first readings
    ({candidate: (first call s, step s)}): the probe they project exceeds `PROBE_SHARE`
    of the first epoch. None: compile them."""
    step_s = next(iter(first.values()))[1]
    traces = sum(max(call - step, 0.0) for call, step in first.values())  # ~ the compiles
    least_rounds = ROUNDS * 2 * len(first) * step_s
    fixed = spent_s + traces + 2 * len(first) * step_s  # + the jitted warm-ups
    projected = fixed + max(rounds_budget(step_s, epoch_steps), least_rounds)
    epoch = epoch_steps or 0
    if step_s <= 0 or projected <= PROBE_SHARE * epoch * step_s:
        return None
    # The rounds grow with the epoch (SHARE of it): the least epoch pays both.
    threshold = math.ceil(
        max((fixed + least_rounds) / PROBE_SHARE, fixed / (PROBE_SHARE - SHARE)) / step_s
    )
    return (
        f"declined: the first readings project a probe of {projected:.2g} s, more than "
        f"{PROBE_SHARE:.0%} of the first epoch ({epoch} steps of {step_s * 1e3:.3g} ms); "
        f"from {threshold:,} steps an epoch up it is measured"
    )


def tied(measured: dict, simpler: tuple, other: tuple) -> str | None:
    """ "No measurable difference ..." when the probe's interleaved readings of `other`
    do not separate it from `simpler` (None: they do, or there are no readings)."""
    both = measured.get("readings", {})
    if simpler not in both or other not in both:
        return None
    names = {simpler: _name(simpler), other: _name(other)}
    verdict = readings.judge({names[c]: both[c] for c in (simpler, other)})
    return None if verdict.separated else verdict.reason


def _name(candidate: tuple) -> str:
    policy_name, jit = candidate
    return f"{policy_name}{' + XLA' if jit else ''}"


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
    of `epoch_steps` of its passes (`FLOOR_S` when unknown).

    Returns `{"rates": {policy: examples/s, the fastest reading}, "readings": {policy:
    examples/s of each interleaved round}, "steps": steps per timed call, "rounds",
    "seconds": the whole probe, "timed_s": the timed rounds, "budget_s"}`.
    """
    steps = [(p, False) for p in policies]
    measured = time_steps(
        model, loss, strategy, feed, steps, builder=builder, epoch_steps=epoch_steps
    )
    measured["rates"] = {p: measured["rates"][(p, False)] for p in policies}
    measured["readings"] = {p: measured["readings"][(p, False)] for p in policies}
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

    Returns `time_policies`' dict keyed by candidate, with `"losses"`, `"dropped"`
    ({candidate: why it was not timed}; a policy whose step fails reads 0 examples/s) and
    `"slow"` ({candidate: why it was read at its warm-up only, `SLOWER`}).

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
        slow = _too_slow(first, candidates[0], strategy)
        live = [c for c in candidates if c in first and c not in slow]
        budget = rounds_budget(first[live[0]][1], epoch_steps)
        per_call = budget / (MAX_ROUNDS * len(live))
        slowest = max(first[c][1] for c in live)
        steps = int(agree(strategy, max(1, min(round(per_call / slowest), 1000))))
        timed = time.perf_counter()
        read = _reader(loops, cached, steps, batch or 1)
        if len(live) > 1:
            settle = lambda stop: not agree(strategy, float(not stop))  # noqa: E731
            found = readings.compare(
                read, live, budget_s=budget, min_rounds=ROUNDS, max_rounds=MAX_ROUNDS,
                settle=settle,
            )  # fmt: skip
            rounds = found.readings
        else:
            rounds = {c: [read(c) for _ in range(ROUNDS)] for c in live}
        timed_s = time.perf_counter() - timed
        # The slowest worker's readings: every worker decides alike.
        rounds = {c: [-agree(strategy, -r) for r in rs] for c, rs in rounds.items()}
        jitted = any(jit for _, jit in live)
        losses = {c: loops[c].loss_once(cached) for c in live} if jitted else {}
    del cached, loops, copies
    timed_rounds = min(len(r) for r in rounds.values())
    rounds.update({c: [(batch or 1) / first[c][1]] for c in slow})  # its warmed step's rate
    rounds.update({c: [0.0] for c in candidates if c not in rounds and not c[1]})  # it fails
    return {
        "rates": {c: max(rounds[c]) for c in rounds},
        "readings": rounds,
        "losses": losses,
        "dropped": dropped,
        "slow": slow,
        "steps": steps,
        "rounds": timed_rounds,
        "seconds": time.perf_counter() - began,
        "timed_s": timed_s,
        "budget_s": budget,
    }


def _too_slow(first: dict, reference: Any, strategy: tf.distribute.Strategy) -> dict:
    """The candidates whose warmed step took `SLOWER` times the reference's or more, with
    why: they cannot win, and timing them would cost rounds sized for the reference (a
    CPU's `mixed_float16` step ran ~1,000x float32's). Their rate is their warmed step's.
    Every worker drops alike (the largest ratio)."""
    base = max(first[reference][1], 1e-12)
    slow = {}
    for c, (_, step) in first.items():
        ratio = agree(strategy, step / base)
        if c != reference and ratio >= SLOWER:
            slow[c] = f"its warmed step took {ratio:.1f}x {reference[0]}'s"
    return slow


def rounds_budget(step_s: float, epoch_steps: int | None) -> float:
    """Seconds of timed rounds: `SHARE` of the first epoch's projected time (`FLOOR_S`
    when its length is unknown)."""
    return SHARE * step_s * epoch_steps if epoch_steps else FLOOR_S


def _reader(loops: dict, cached: Any, steps: int, batch: int) -> Callable[[Any], float]:
    """One reading of a candidate: examples/s of one timed call of `steps` passes."""

    def read(candidate: Any) -> float:
        seconds = loops[candidate].seconds(False, cached, steps, 1)[0]
        return batch * steps / max(seconds, 1e-12)

    return read


def described(measured: dict) -> str:
    """What a measurement timed, for a choice's reason."""
    return (
        f"the model's passes, {measured['rounds']} rounds of {measured['steps']} step(s); "
        f"probe {measured['seconds']:.1f} s"
    )
