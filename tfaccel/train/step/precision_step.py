"""`Trainer(..., precision=...)`: the model copied under a dtype policy, and "auto" timed.

A copy under a policy has the same weights (variables stay float32 under the mixed
policies) and computes in the policy's dtype, except the layers that give the model's
outputs: they compute in float32, so the loss does (as `tfaccel.models`' classifier).
From the user's model-building function, the function is called under the policy
instead (its own layers' dtypes win).

"auto" times the forward and backward passes of each candidate copy on one cached
batch of the training data (the optimizer's update is float32 under every policy),
after a warm-up, in alternating rounds; `precision.decide` keeps float32 unless another
policy is 5 % faster. Nothing of the user's run moves: the copies are thrown away, the
data is read through its own iterator, and Python's, NumPy's and TensorFlow's global
random states are put back.

The probe pays only when the job is long enough to earn it back: it runs at least
`probe_steps(n)` steps of the model's passes (a warm-up of two calls and `ROUNDS` timed
calls per candidate), while the most a candidate can save is `1 - 1/gain` of every
training step, the gain bounded by the operations' rates that `precision.choose`
measured once per machine (matmuls and a convolution, cached in a file; a whole step
gains less). A job
of fewer steps than `probe_steps(n) / (1 - 1/gain)` times nothing of the model: it
takes the operations' pick when that is `RULE_GAIN` (1.5x) float32's or more, else
keeps the model's policy, with the reason (the mixed-precision guide's dense model,
scaled to this CPU: a 14.9 s probe for a 12-step job; bfloat16's operations 2.36x
float32's, its training steps about 2x). On a multi-worker job the workers decide from the
same rates (`operations`): each worker's own reading, or one read from the cache while
another measured, would let one time the model (collectives the others never call) or
copy it under another policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import re
import time

import keras
import numpy as np
import tensorflow as tf

from tfaccel import precision
from tfaccel.data import iterators
from tfaccel.train.loop.agreement import agree, is_multi_worker
from tfaccel.train.step.passes import GradientLoops
from tfaccel.train.step.runner import build_symbolically

SHARE = 0.05  # the timed rounds' cost: at most this share of one epoch
ROUNDS = 3
FLOOR_S = 1.0  # ... but never less than this (a short epoch still gets a reading)
RULE_GAIN = 1.5  # a job too short to time: the operations' pick when this much faster


def probe_steps(candidates: int) -> int:
    """The fewest steps of the passes the probe runs: warm-up (2) and timed rounds."""
    return candidates * (2 + ROUNDS)


def operations(strategy=None) -> precision.Choice:
    """`precision.choose()` (the operations' rates, once per machine); on a multi-worker
    job every rate is agreed first (the largest any worker read), so that every worker
    makes the same decisions from them."""
    ops = precision.choose()
    if strategy is None or not ops.rates or not is_multi_worker(strategy):
        return ops
    rates = {p: agree(strategy, r) for p, r in sorted(ops.rates.items())}
    what = "the operations' rates, each the largest any worker read"
    return dataclasses.replace(precision.decide(rates, ops.unit, what), source=ops.source)


def by_operations(kept: str, short: str, ops: precision.Choice | None = None) -> precision.Choice:
    """A job too short to time the model: the operations' pick (`ops`, default this
    machine's) when it is `RULE_GAIN` times float32's or more (a whole step gains less
    than its matmuls), else `kept`."""
    ops = ops or precision.choose()
    gain = ops.rates.get(ops.policy, 0.0) / ops.rates.get("float32", float("inf"))
    if ops.policy != "float32" and gain >= RULE_GAIN:
        return precision.Choice(
            ops.policy,
            f"by the operations' rates, {gain:.2f}x float32's (>= {RULE_GAIN}x), not timed "
            f"on the model: {short}" + (f"; the operations' {ops.source}" if ops.source else ""),
            dict(ops.rates),
            ops.unit,
        )
    return precision.Choice(kept, f"kept: not measured ({short})")


def too_short(
    policies: list[str], job_steps: int | None, ops: precision.Choice | None = None
) -> str | None:
    """Why timing `policies` on a job of `job_steps` steps cannot pay (None: it may), from
    the operations' rates (`ops`, default this machine's: once per machine, cached).

    Unknown length, or operations' rates not measured (hypothetical hardware): None.
    """
    if job_steps is None or len(policies) < 2:
        return None
    rates = (ops or precision.choose()).rates
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


def under(model: keras.Model, policy: str, builder=None) -> keras.Model:
    """A copy of `model` computing under `policy`, with its weights (call in the scope).

    Raises:
        ValueError: the model cannot be copied (a subclassed model without a config and
            no builder); the message says what to pass instead.
    """
    try:
        with precision.scope(policy):
            if builder is not None:
                copy = builder()
            else:
                outputs = {id(t._keras_history[0]) for t in model.outputs}
                copy = keras.models.clone_model(
                    model, clone_function=lambda layer: _layer_under(layer, policy, outputs)
                )
        copy_weights(model, copy)
    except Exception as error:  # noqa: BLE001 - re-raised with what to do
        raise ValueError(
            f"The model could not be copied under the dtype policy {policy!r} "
            f"({type(error).__name__}: {error}). Pass a function that builds it, "
            "Trainer(build_model, precision=...), or build it under "
            "tfaccel.precision.scope(policy) yourself."
        ) from error
    return copy


def copy_weights(source: keras.Model, copy: keras.Model) -> None:
    """`copy.set_weights(source.get_weights())` without the round trip through NumPy: each
    variable is assigned the other's value (on a 16.8M-weight model 0.1-0.3 s became
    ~1 ms). Weights that do not pair up by count and shape go through `set_weights`, which
    says what differs."""
    pairs = list(zip(source.weights, copy.weights, strict=False))
    if len(source.weights) != len(copy.weights) or any(
        tuple(s.shape) != tuple(c.shape) for s, c in pairs
    ):
        copy.set_weights(source.get_weights())
        return
    for s, c in pairs:
        c.assign(s.value)


def _layer_under(layer, policy: str, outputs: set):
    config = layer.get_config()
    config["dtype"] = "float32" if id(layer) in outputs else policy
    try:
        return layer.__class__.from_config(config)
    except (TypeError, ValueError):  # a nested model: its own layers follow the global policy
        config.pop("dtype")
        return layer.__class__.from_config(config)


@contextlib.contextmanager
def random_states_kept():
    """Puts back Python's, NumPy's and TensorFlow's global random states on exit."""
    python, numpy_state = random.getstate(), np.random.get_state()
    generator = tf.random.get_global_generator()
    tf_state = generator.state.numpy()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        generator.reset(tf_state)


def time_policies(
    model, loss, strategy, feed, policies, *, builder=None, epoch_steps: int | None = None
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
    model, loss, strategy, feed, candidates, *, builder=None, epoch_steps=None, admit=None
) -> dict:
    """Examples/s of each candidate step `(policy, jit_compile)`, and what it cost.

    The first candidate (un-jitted) is the reference of the timed rounds' budget, as in
    `time_policies`. The un-jitted candidates warm up first; then `admit(readings)`
    ({candidate: (first call s, one step s)}) may return why the jitted ones are not
    worth compiling; one XLA cannot compile is dropped with the reason. Where a jitted
    candidate remains, each candidate's loss on the cached batch is read (inference mode).

    Returns `time_policies`' dict keyed by candidate, with `"losses"` and `"dropped"`
    ({candidate: why it was not timed}).
    """
    began = time.perf_counter()
    batch = feed.global_batch
    with random_states_kept(), strategy.scope():
        copies = {p: under(model, p, builder) for p in dict.fromkeys(p for p, _ in candidates)}
        cached = iterators.adopt(iter(feed.one_batch().distribute(endless=True)))
        loops = {c: GradientLoops(copies[c[0]], loss, strategy, c[1]) for c in candidates}
        first, dropped = _warm_up(loops, cached, admit, strategy)
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


def _warm_up(loops: dict, cached, admit, strategy) -> tuple[dict, dict]:
    """Traces and times one step of each candidate, the un-jitted first (see `time_steps`)."""
    first = {c: tuple(loop.seconds(False, cached, 1, 2)) for c, loop in loops.items() if not c[1]}
    jitted = [c for c in loops if c[1]]
    why = admit(first) if admit is not None and jitted else None
    if jitted and agree(strategy, float(why is not None)) and not why:  # the workers agree
        why = "declined: another worker's first readings project a probe over its share"
    dropped = {}
    for c in jitted:
        if why:
            dropped[c] = why
            continue
        try:
            first[c] = tuple(loops[c].seconds(False, cached, 1, 2))
        except tf.errors.OpError as error:  # the plain step ran: XLA does not work here
            dropped[c] = f"XLA cannot compile the model's step ({_unsupported(error)})"
    for c in jitted:  # one candidate set on every worker: the rounds' collectives match
        if agree(strategy, float(c in dropped)) and c not in dropped:
            dropped[c] = "XLA failed on another worker"
            del first[c]
    return first, dropped


def _unsupported(error: Exception) -> str:
    """The ops XLA named as unsupported, else the first root error's message."""
    text = str(error).strip()
    found = re.search(r"on XLA_\w+: (.+?) \(No registered", text)
    if found:
        return f"unsupported op(s): {found.group(1)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    roots = [line for line in lines if re.match(r"\(\d+\) [A-Z_]+: ", line)]
    line = (roots or lines or [type(error).__name__])[0]
    line = re.sub(r"^\(\d+\) [A-Z_]+: (\{\{[^}]*\}\} )?", "", line)
    return re.sub(r" \(defined @ [^)]*\)", "", line)[:200]


def choose(
    model, loss, strategy, feed, *, builder=None, epoch_steps=None, job_steps=None
) -> precision.Choice:
    """The policy for this model's step on this machine ("auto"), with what was measured;
    the model's own policy, not measured, when a job of `job_steps` is `too_short`."""
    policies, why = precision.candidates()
    if len(policies) == 1:
        return precision.Choice("float32", why)
    ops = operations(strategy) if job_steps is not None else None
    short = too_short(policies, job_steps, ops)
    if short:
        return by_operations(model.dtype_policy.name, short, ops)
    measured = time_policies(
        model, loss, strategy, feed, policies, builder=builder, epoch_steps=epoch_steps
    )
    what = (
        f"the model's passes, {measured['rounds']} rounds of {measured['steps']} step(s); "
        f"probe {measured['seconds']:.1f} s"
    )
    choice = precision.decide(measured["rates"], "examples/s", what)
    return dataclasses.replace(choice, cost_s=measured["seconds"])


def choose_for_feed(
    model, loss, strategy, feed, builder, steps_per_epoch, job_steps=None
) -> precision.Choice:
    """`choose` for a Trainer's first fit on `feed`; "auto" never stops training, so a
    probe that cannot measure keeps the model's policy and says why.

    A dataset function is read through a second build (`Feed.rebuilt`): reading the
    training build would draw its shuffle's first seeds and move the training order.
    """
    with strategy.scope():
        if not model.built or not model.weights:
            build_symbolically(model, feed.element_spec[0])
    epoch_steps = steps_per_epoch or (feed.steps if feed.steps > 0 else None)
    try:
        return choose(
            model,
            loss,
            strategy,
            feed.rebuilt() if feed.is_function else feed,
            builder=builder,
            epoch_steps=epoch_steps,
            job_steps=job_steps,
        )
    except ValueError as error:
        return precision.Choice(model.dtype_policy.name, f"kept: not measured ({error})")
