"""The step probe: the model's forward and backward passes timed on one cached batch,
under each candidate setting (a dtype policy, with or without XLA).

Copies of the model (`copies.under`) run `passes.GradientLoops` on one cached batch of the
training data, after a warm-up, in alternating rounds (the fastest call counts: noise only
slows a call down); the optimizer's update is float32 under every policy, so it is left
out. Nothing of the user's run moves: the copies are thrown away, the data is read through
its own iterator, and Python's, NumPy's and TensorFlow's global random states are put back.
The timed rounds stay within `SHARE` of an epoch (at least `FLOOR_S`). On a multi-worker
job every size and reading goes through `agreement.agree`, so that every worker runs the
same calls and makes the same choice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import tensorflow as tf

from tfaccel.choices.agreement import agree
from tfaccel.choices.copies import random_states_kept, under
from tfaccel.choices.passes import GradientLoops
from tfaccel.data import iterators

SHARE = 0.05  # the timed rounds' cost: at most this share of one epoch
ROUNDS = 3
FLOOR_S = 1.0  # ... but never less than this (a short epoch still gets a reading)


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
    model,
    loss,
    strategy,
    feed,
    candidates,
    *,
    builder=None,
    epoch_steps: int | None = None,
    admit: Callable[[dict], str | None] | None = None,
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
