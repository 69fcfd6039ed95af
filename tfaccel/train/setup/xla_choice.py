"""`Trainer(..., jit_compile="auto")`: XLA measured on the model's own step, as precision is.

XLA pays on some models and costs on others (on this project's CPUs a dense MLP ran
2.75x faster with it, a CNN 0.66x), so "auto" times the model's forward and backward
passes with and without it, with `precision_step`'s machinery: copies of the model, one
cached batch, a warm-up, alternating rounds within 5 % of an epoch, and Python's,
NumPy's and TensorFlow's random states and the data's position left as they were. XLA is
chosen only when it is `MIN_GAIN` (5 %) faster and its loss on the cached batch equals the
plain step's within `tolerance(policy)` × max(1, |loss|).

XLA's compilation is the probe's big cost, so the whole probe is bounded by `SHARE` of
the job (epochs × steps): it is not run when its least cost (`PROBE_STEPS` steps per
candidate) could not fit, nor when the plain steps' first readings project more (their
tracing stands in for the compilation, which takes at least as long). A model XLA cannot
compile (a `py_function`, a string op) stays un-jitted with the ops XLA named.

With `precision="auto"` too, every policy is timed with and without XLA: a policy's step
is its faster one (XLA only where it won as above), and `precision.decide` picks the
policy from those, so a bfloat16 + XLA step is a candidate.
"""

from __future__ import annotations

import dataclasses
import math
import time

import keras
from tensorflow.python.framework import config as tf_config

from tfaccel import precision
from tfaccel.train.setup import settings
from tfaccel.train.step import precision_step
from tfaccel.train.step.runner import build_symbolically

SHARE = precision_step.SHARE  # the whole probe, compilation included: this share of the job
PROBE_STEPS = 2 + precision_step.ROUNDS  # per candidate, at least: warm-up and timed rounds
MIN_GAIN = precision.MIN_GAIN
LOSS_TOLERANCE = {"32-bit": 1e-3, "16-bit": 2e-2}
"""Relative loss difference (× max(1, |loss|)) within which XLA's step counts as equal."""


def tolerance(policy: str) -> float:
    """The loss tolerance of `policy`: 16-bit compute rounds at 2-3 significant digits."""
    bits = "16-bit" if "16" in keras.DTypePolicy(policy).compute_dtype else "32-bit"
    return LOSS_TOLERANCE[bits]


@dataclasses.dataclass(frozen=True)
class XlaChoice:
    """Whether the Trainer's step is compiled with XLA, why, and what was measured.

    `rates` holds the chosen policy's step without ("plain") and with ("XLA") XLA, in
    examples/s; empty when nothing was timed.
    """

    jit_compile: bool
    reason: str
    rates: dict = dataclasses.field(default_factory=dict)
    cost_s: float = 0.0

    def describe(self) -> str:
        """One line for the settings table: the choice, why, and both measured rates."""
        if not self.rates:
            return f"{self.jit_compile} ({self.reason})"
        rates = ", ".join(f"{k} {r:,.4g} examples/s" for k, r in self.rates.items())
        return f"{self.jit_compile} ({self.reason}; {rates})"


def job_steps(feed, steps_per_epoch: int | None, epochs: int) -> int | None:
    """The job's training steps (epochs × steps per epoch); None when unknown."""
    epoch = steps_per_epoch or (feed.steps if feed.steps > 0 else None)
    return epoch * max(epochs, 0) if epoch else None


def not_measured(model, steps: int | None, policies: int) -> str | None:
    """Why XLA is not timed at all, known before anything runs (None: time it)."""
    bad = settings.unsupported_jit_layers(model)
    if bad:
        return f"layer(s) {bad} do not support XLA (supports_jit=False)"
    if tf_config.is_op_determinism_enabled():  # not in tf.config's public names
        return "op determinism is enabled, and XLA's kernels are not all deterministic"
    if steps is None:
        return "the job's length is unknown (pass steps_per_epoch)"
    least = 2 * policies * PROBE_STEPS
    if steps * SHARE < least:
        return (
            f"a job of {steps} steps is too short: the probe takes at least {least} steps and "
            f"XLA's compilation, more than {SHARE:.0%} of it; from {math.ceil(least / SHARE)} "
            "steps up it is measured"
        )
    return None


def choose_autos(trainer, feed, steps_per_epoch, epochs: int) -> tuple:
    """The Trainer's "auto" precision and XLA at its first fit: `(precision.Choice or None,
    XlaChoice or None)`, None for what is not "auto" or already decided."""
    precision_open = trainer._auto_precision and trainer.precision_choice is None
    xla_open = trainer._auto_jit and trainer.jit_choice is None
    if not (precision_open or xla_open):
        return None, None
    model = trainer.model
    if trainer.runner.loops is not None:  # evaluate ran first: the step exists already
        kept = "kept: evaluate ran before the first fit"
        return (
            precision.Choice(model.dtype_policy.name, kept) if precision_open else None,
            XlaChoice(trainer.jit_compile, kept) if xla_open else None,
        )
    args = (model, trainer.loss, trainer.strategy, feed, trainer._builder, steps_per_epoch)
    policies = precision.candidates()[0] if precision_open else [model.dtype_policy.name]
    steps = job_steps(feed, steps_per_epoch, epochs)
    why = not_measured(model, steps, len(policies)) if xla_open else None
    if not xla_open or why:
        chosen = precision_step.choose_for_feed(*args, steps) if precision_open else None
        return chosen, (XlaChoice(False, f"not measured: {why}") if xla_open else None)
    return choose_for_feed(*args, policies=policies, steps=steps, precision_open=precision_open)


def choose_for_feed(
    model, loss, strategy, feed, builder, steps_per_epoch, *, policies, steps, precision_open
) -> tuple:
    """Times `policies` with and without XLA on `feed` (a dataset function through a second
    build, as `precision_step.choose_for_feed`) and decides; "auto" never stops training,
    so a model that cannot be copied is kept as it is, with the reason."""
    with strategy.scope():
        if not model.built or not model.weights:
            build_symbolically(model, feed.element_spec[0])
    epoch_steps = steps_per_epoch or (feed.steps if feed.steps > 0 else None)
    candidates = [(p, False) for p in policies] + [(p, True) for p in policies]
    began = time.perf_counter()
    try:
        measured = precision_step.time_steps(
            model,
            loss,
            strategy,
            feed.rebuilt() if feed.is_function else feed,
            candidates,
            builder=builder,
            epoch_steps=epoch_steps,
            admit=lambda first: admit(first, steps, epoch_steps, time.perf_counter() - began),
        )
    except ValueError as error:
        kept = f"kept: not measured ({error})"
        policy = precision.Choice(model.dtype_policy.name, kept) if precision_open else None
        return policy, XlaChoice(False, kept)
    return decide(measured, policies, precision_open)


def admit(first: dict, steps: int, epoch_steps: int | None, spent_s: float) -> str | None:
    """Why the jitted candidates are not compiled, from the plain ones' first readings
    ({candidate: (first call s, step s)}): the probe they project exceeds `SHARE` of the
    job. None: compile them."""
    step_s = next(iter(first.values()))[1]
    traces = sum(max(call - step, 0.0) for call, step in first.values())  # ~ the compiles
    rounds = max(SHARE * step_s * (epoch_steps or 0), precision_step.FLOOR_S)
    rounds = max(rounds, precision_step.ROUNDS * 2 * len(first) * step_s)
    projected = spent_s + traces + 2 * len(first) * step_s + rounds  # + the jitted warm-ups
    if step_s <= 0 or projected <= SHARE * steps * step_s:
        return None
    threshold = math.ceil(projected / (SHARE * step_s))
    return (
        f"declined: the first readings project a probe of {projected:.2g} s, more than "
        f"{SHARE:.0%} of the job ({steps} steps of {step_s * 1e3:.3g} ms); from "
        f"{threshold:,} steps up it is measured"
    )


def verdict(policy: str, measured: dict) -> tuple[bool, str]:
    """Whether `policy`'s step is jitted: XLA compiled, `MIN_GAIN` faster, equal loss."""
    rates, losses = measured["rates"], measured["losses"]
    if (policy, True) in measured["dropped"]:
        return False, measured["dropped"][(policy, True)]
    gain = rates[(policy, True)] / rates[(policy, False)]
    plain, jitted = losses[(policy, False)], losses[(policy, True)]
    difference, bound = abs(jitted - plain), tolerance(policy) * max(1.0, abs(plain))
    if not difference <= bound:  # a NaN loss is not equal either
        return False, (
            f"XLA's loss {jitted:.6g} differs from the plain step's {plain:.6g} by "
            f"{difference:.2g} > {bound:.2g} ({tolerance(policy):g} x max(1, |loss|))"
        )
    equal = f"loss equal (|diff| {difference:.2g} <= {bound:.2g})"
    if gain < MIN_GAIN:
        return False, f"XLA only {gain:.2f}x the plain step (< {MIN_GAIN}x), {equal}"
    return True, f"XLA {gain:.2f}x the plain step (>= {MIN_GAIN}x), {equal}"


def decide(measured: dict, policies: list[str], precision_open: bool) -> tuple:
    """`(precision.Choice or None, XlaChoice)` from `precision_step.time_steps`' readings:
    XLA per policy (`verdict`), then the policy from each one's faster step."""
    rates, cost = measured["rates"], measured["seconds"]
    what = (
        f"the model's passes, {measured['rounds']} rounds of {measured['steps']} step(s); "
        f"probe {cost:.1f} s"
    )
    verdicts = {p: verdict(p, measured) for p in policies}
    step_rates = {p: rates[(p, verdicts[p][0])] for p in policies}
    chosen = None
    if precision_open and len(policies) > 1:
        each = what.replace("passes,", "passes (each policy's with XLA where XLA won),", 1)
        chosen = precision.decide(step_rates, "examples/s", each)
        chosen = dataclasses.replace(chosen, cost_s=cost)
    elif precision_open:
        chosen = precision.Choice(policies[0], precision.candidates()[1])
    policy = chosen.policy if chosen is not None else policies[0]
    jit, why = verdicts.get(policy, (False, f"{policy} was not timed"))
    pairs = (("plain", (policy, False)), ("XLA", (policy, True)))
    figures = {k: rates[c] for k, c in pairs if c in rates}
    return chosen, XlaChoice(jit, f"{why}; measured on {what}", figures, cost)
