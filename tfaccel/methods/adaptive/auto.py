"""`methods="auto"`: the stack chosen on the user's own job by short paired probes.

Rule of size: the probes may cost at most `PROBE_SHARE` (5 %) of the projected job's
optimizer steps (`epochs × steps_per_epoch`). Each of the candidate stacks (none, "fast"'s
stack and "fast"'s stack with the length-free `Plateau` schedule) is probed on `SEEDS`
seeds for `P` training steps plus `EVAL_BATCHES` held-out batches, counted as steps:
`candidates × SEEDS × (P + EVAL_BATCHES) ≤ 5 %` of the job. A job whose `P` would be under
`MIN_PROBE_STEPS` is too short to pay: it declines at once (arithmetic only: no batch read,
no model cloned, no step) and trains with "fast"'s stack, saying from what size it probes
(`probes_from`: 4,320 steps with three candidates). The seconds are held to the same
share: when the plain stack's probes (traces included) took more than 5 % of the job's
projected seconds (its steps at the probes' step time) over the number of stacks, probing
stops there and the job trains with "fast"'s stack, saying so (`TIME_RULE`).

A probe: the user's model cloned with its current weights (`keras.models.clone_model`),
a fresh copy of the optimizer, the candidate's plan for the *whole* job (its schedule
read at the job's first `P` steps), trained with `model.fit` on the same first batches
for every candidate (seed `s` takes the window of batches `s × (P + EVAL_BATCHES)` on);
then the user's own loss (its labels as given, no smoothing) on the `EVAL_BATCHES`
batches that follow, which no probe trained on. Seeds also set Keras' random seed
(`seed + s`: dropout, the batch maps' draws), so the probes are reproducible with `seed`.

Significance rule: a candidate is kept when, on every seed, its held-out loss is below the
plain run's by more than `MARGIN` (1 %) of it (a sign test on three paired seeds: 1 in 8
under no effect); among those kept, the lowest mean loss wins; none kept: no method. The
plan's `chosen` (the settings table's first row) gives the losses of each candidate per
seed, the probes' steps and seconds (and their share of the job's seconds projected at the
plain probes' step time: their traces make it larger than the steps' share on short jobs),
and the choice. Limits: the probes see the start of
the job only (a stack that pays late is not seen to win), the loss is the user's, so label
smoothing's softer targets count against it, and a model `clone_model` cannot copy (a
subclassed model) or data that is not a `tf.data.Dataset` declines to "fast"'s stack too.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfaccel.methods.base import Job, MethodPlan
from tfaccel.methods.batch_maps import transform

PROBE_SHARE = 0.05
"""The most the probes may cost, as a share of the projected job's optimizer steps."""
SEEDS = 3
MIN_PROBE_STEPS = 16
EVAL_BATCHES = 8
MARGIN = 0.01
TIME_RULE = True
"""Whether the probes also stop when the plain stack's took over 5 % of the job's projected
seconds / the number of stacks (traces included): the steps' share is the rule of size,
this one keeps the seconds within it too."""
"""A kept candidate's loss is below the plain run's by more than this share, every seed."""

# name -> the methods argument of a candidate ("fast", or a list) for the job
Candidates = dict[str, Callable[[Job], Any]]
Planner = Callable[[Any, Job], MethodPlan]


def probes_from(candidates: int = 3) -> int:
    """The job's optimizer steps from which `candidates` stacks are probed."""
    return int(np.ceil(candidates * SEEDS * (MIN_PROBE_STEPS + EVAL_BATCHES) / PROBE_SHARE))


def probe_steps(job: Job, candidates: int = 3) -> int:
    """Training steps of one probe within the budget (under `MIN_PROBE_STEPS`: declined)."""
    return int(PROBE_SHARE * job.total_steps / (candidates * SEEDS)) - EVAL_BATCHES


@dataclasses.dataclass
class AutoChoice:
    """What "auto" chose and why.

    Attributes:
        name: the candidate kept ("none", "fast", ...), or "fast" when it declined.
        methods: the methods argument to plan the job with.
        losses: candidate -> the held-out loss per seed (empty when it declined).
        steps: training steps per probe (0 when it declined).
        seconds: the probes' wall time.
        projected: the job's seconds at the plain probes' fastest step time (0: declined).
        text: the settings table's sentence.
    """

    name: str
    methods: Any
    losses: dict[str, list[float]]
    steps: int
    seconds: float
    text: str
    projected: float = 0.0


def declined(job: Job, why: str, fallback: Any) -> AutoChoice:
    """The choice without probes: "fast"'s stack, and why none ran."""
    text = f'auto: no probe ({why}); "fast"\'s stack is used'
    return AutoChoice("fast", fallback, {}, 0, 0.0, text)


def choose(
    job: Job, data: Any, candidates: Candidates, planner: Planner, seed: int = 0
) -> AutoChoice:
    """Probes `candidates` (the first named the plain run) on `job` and `data`; returns the
    `AutoChoice`. A job under `probes_from(len(candidates))` steps declines at once."""
    names = list(candidates)
    steps = probe_steps(job, len(names))
    if steps < MIN_PROBE_STEPS:
        why = (
            f"a job of {job.total_steps:,} optimizer steps is too short to pay for them: "
            f"{len(names)} stacks x {SEEDS} seeds are probed from {probes_from(len(names)):,} "
            f"steps, within {PROBE_SHARE:.0%} of the job"
        )
        return declined(job, why, "fast")
    if not isinstance(data, tf.data.Dataset):
        return declined(job, "the training data is not a tf.data.Dataset", "fast")
    try:
        keras.models.clone_model(job.model)
    except (ValueError, TypeError, NotImplementedError) as error:
        return declined(job, f"the model cannot be cloned: {error}", "fast")
    began = time.perf_counter()
    window = steps + EVAL_BATCHES
    batches = list(data.repeat().take(SEEDS * window))
    losses: dict[str, list[float]] = {}
    timed: list[float] = []  # seconds a step of the plain probes after their first fit
    with warnings.catch_warnings():  # the probes' plans and fits say nothing to the user
        warnings.simplefilter("ignore")
        for name in names:
            plain = name == names[0]
            argument = candidates[name](job)
            found = _probe(job, argument, planner, batches, steps, seed, timed if plain else [])
            losses[name] = found
            if plain and TIME_RULE:
                spent = time.perf_counter() - began
                projected = min(timed, default=0.0) * job.total_steps
                if spent * len(names) > PROBE_SHARE * projected:
                    why = (
                        f"stopped after the plain stack's probes: at their {spent:.1f} s the "
                        f"{len(names)} stacks' would take {spent * len(names):.1f} s, over "
                        f"{PROBE_SHARE:.0%} of the job's projected {projected:,.1f} s (its "
                        "steps at the probes' step time)"
                    )
                    return declined(job, why, "fast")
    seconds = time.perf_counter() - began
    projected = min(timed, default=0.0) * job.total_steps
    kept = [
        n
        for n in names[1:]
        if all(c < b * (1 - MARGIN) for c, b in zip(losses[n], losses[names[0]], strict=True))
    ]
    name = min(kept, key=lambda n: float(np.mean(losses[n]))) if kept else names[0]
    text = _text(job, losses, steps, (seconds, projected), name)
    return AutoChoice(name, candidates[name](job), losses, steps, seconds, text, projected)


def _probe(
    job: Job,
    argument: Any,
    planner: Planner,
    batches: list,
    steps: int,
    seed: int,
    timed: list[float],
) -> list[float]:
    """One candidate's held-out loss per seed (inf when its plan does not apply); adds to
    `timed` the seconds a step took in each fit after the first (traced) one."""
    window = steps + EVAL_BATCHES
    model = keras.models.clone_model(job.model)
    start = job.model.get_weights()
    optimizer = type(job.optimizer).from_config(job.optimizer.get_config())
    probe_job = dataclasses.replace(job, model=model, optimizer=optimizer)
    try:
        plan = planner(argument, probe_job)
    except (ValueError, TypeError):
        return [float("inf")] * SEEDS
    model.compile(optimizer=plan.optimizer, loss=plan.loss, jit_compile=False)
    plan.optimizer.build(model.trainable_variables)
    fresh = [v.numpy() for v in plan.optimizer.variables]
    loss_fn = keras.losses.get(job.loss) if isinstance(job.loss, str) else job.loss
    found = []
    for s in range(SEEDS):
        keras.utils.set_random_seed(seed + s)
        model.set_weights(start)
        for variable, value in zip(plan.optimizer.variables, fresh, strict=True):
            variable.assign(value)
        train = batches[s * window : s * window + steps]
        dataset = tf.data.Dataset.from_generator(
            lambda part=train: iter(part), output_signature=job.element_spec
        )
        for regroup in plan.regroups:
            dataset = regroup(dataset)
        began = time.perf_counter()
        model.fit(transform(dataset, plan.maps, seed + s), epochs=1, verbose=0)
        if s:
            timed.append((time.perf_counter() - began) / steps)
        held = batches[s * window + steps : (s + 1) * window]
        found.append(_loss(model, loss_fn, held))
    return found


def _loss(model: keras.Model, loss_fn: Any, batches: list) -> float:
    """The user's loss (its own labels) on `batches`, the mean over their examples."""
    total, count = 0.0, 0
    for batch in batches:
        x, y = batch[0], batch[1]
        weight = batch[2] if len(batch) > 2 else None
        values = loss_fn(y, model(x, training=False))
        values = tf.reshape(tf.convert_to_tensor(values), [-1])
        if weight is not None and values.shape[0] != 1:
            values = values * tf.cast(tf.reshape(weight, [-1]), values.dtype)
        size = int(tf.shape(tf.nest.flatten(x)[0])[0])
        total += float(tf.reduce_mean(values)) * size
        count += size
    return total / max(count, 1)


def _text(
    job: Job, losses: dict[str, list[float]], steps: int, times: tuple[float, float], name: str
) -> str:
    """The settings table's sentence: the comparison measured and the choice."""
    seconds, projected = times
    share = (
        f", {seconds / projected:.0%} of the job's projected {projected:,.0f} s"
        if projected
        else ""
    )
    names = list(losses)
    spent = len(names) * SEEDS * (steps + EVAL_BATCHES)
    measured = "; ".join(f"{n} {'/'.join(f'{v:.4f}' for v in losses[n])}" for n in names)
    rule = f"kept when below {names[0]}'s on every seed by more than {MARGIN:.0%}"
    return (
        f"auto: probed {', '.join(names)} on {SEEDS} seeds x {steps} steps "
        f"({spent:,} steps, {spent / job.total_steps:.1%} of the job's {job.total_steps:,}; "
        f"{seconds:.1f} s{share}); held-out loss {measured}; {rule}: {name}"
    )
