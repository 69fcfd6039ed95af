"""`Trainer(..., jit_compile="auto")`: XLA measured on the model's own step, as precision is.

Where the job is long enough (`timing.online_fits`: a first epoch of 100 steps or more
and, with a fixed loop size, `timing.ONLINE_LOOPS` loops), XLA is chosen *online*, on the
job's own steps: the first loops of training alternate the plain and the XLA step and the
faster by a 95 % interval is kept (`online`; the answer before step 1 is an `XlaChoice`
with `online=True`). A shorter job keeps the probe described below.

XLA pays on some models and costs on others (on this project's CPUs a dense MLP ran
2.75x faster with it, a CNN 0.66x), so "auto" times the model's forward and backward
passes with and without it, with the step probe (`timing`): copies of the model, one
cached batch, a warm-up, alternating rounds within 5 % of an epoch, and Python's,
NumPy's and TensorFlow's random states and the data's position left as they were. XLA is
chosen only when it is `MIN_GAIN` (5 %) faster and its loss on the cached batch equals the
plain step's within `tolerance(policy)` × max(1, |loss|).

XLA's compilation is the probe's big cost, so the whole probe is bounded by 5 % of the job
(`timing.too_short_for_xla`, `timing.admit`). A model XLA cannot compile (a `py_function`, a
string op) stays un-jitted with the ops XLA named; one whose layers say they do not support
it (`supports_jit = False`), or a process with op determinism on, is not tried
(`not_compilable`).

With `precision="auto"` too, every policy is timed with and without XLA: a policy's step
is its faster one (XLA only where it won as above), and `policy.decide` picks the
policy from those, so a bfloat16 + XLA step is a candidate (`decide`; `resolution` runs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
from tensorflow.python.framework import config as tf_config

from tfaccel.choices import policy as dtype_policies
from tfaccel.choices import timing
from tfaccel.choices.choice import Choice
from tfaccel.choices.policy import PolicyChoice

if TYPE_CHECKING:
    import tensorflow as tf

    from tfaccel.data.assembly.feed import Feed

MIN_GAIN = dtype_policies.MIN_GAIN
ONLINE_PENDING = "the first loops of training alternate"
"""How the XLA row begins while the first loops of training will decide it (`online`)."""
LOSS_TOLERANCE = {"32-bit": 1e-3, "16-bit": 2e-2}
"""Relative loss difference (× max(1, |loss|)) within which XLA's step counts as equal."""


def tolerance(policy: str) -> float:
    """The loss tolerance of `policy`: 16-bit compute rounds at 2-3 significant digits."""
    bits = "16-bit" if "16" in keras.DTypePolicy(policy).compute_dtype else "32-bit"
    return LOSS_TOLERANCE[bits]


@dataclasses.dataclass(frozen=True)
class XlaChoice(Choice):
    """Whether the Trainer's step is compiled with XLA, why, and what was measured (a
    `Choice` whose value is `jit_compile`).

    `rates` (the figures) holds the chosen policy's step without ("plain") and with
    ("XLA") XLA, in examples/s; empty when nothing was timed.
    """

    unit: str = "examples/s"
    online: bool = False  # decided by the first loops of training (`online`), not a probe

    def describe(self) -> str:
        """As `Choice.describe`; before an online A/B decided, "online (...)"."""
        text = super().describe()
        if self.online and self.reason.startswith(ONLINE_PENDING):
            return f"online{text[len(str(self.value)) :]}"
        return text

    @property
    def jit_compile(self) -> bool:
        """Whether the step is compiled with XLA (the value)."""
        return bool(self.value)


def unsupported_jit_layers(model: keras.Model) -> list[str]:
    """Names of the model (e.g. a `PipelineModel`) or its layers with `supports_jit = False`."""
    return [
        layer.name
        for layer in model._flatten_layers(include_self=True)
        if not getattr(layer, "supports_jit", True)
    ]


def not_compilable(model: keras.Model) -> str | None:
    """Why XLA is not tried on `model` at all, known before anything runs (None: try it);
    whether the job is long enough is the probe's question (`timing.too_short_for_xla`)."""
    bad = unsupported_jit_layers(model)
    if bad:
        return f"layer(s) {bad} do not support XLA (supports_jit=False)"
    if tf_config.is_op_determinism_enabled():  # not in tf.config's public names
        return "op determinism is enabled, and XLA's kernels are not all deterministic"
    return None


def verdict(policy: str, measured: dict) -> tuple[bool, str]:
    """Whether `policy`'s step is jitted: XLA compiled, `MIN_GAIN` faster, told apart from
    the plain step by the interleaved readings (`timing.tied`), equal loss."""
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
    tie = timing.tied(measured, (policy, False), (policy, True))
    if tie:
        return False, f"{tie}, {equal}"
    return True, f"XLA {gain:.2f}x the plain step (>= {MIN_GAIN}x), {equal}"


def decide(
    measured: dict,
    policies: list[str],
    precision_open: bool,
    judge: Callable[[PolicyChoice], PolicyChoice] | None = None,
) -> tuple:
    """`(PolicyChoice or None, XlaChoice)` from `timing.time_steps`' readings: XLA per
    policy (`verdict`), then the policy from each one's faster step (`policy_of`), which
    `judge` may overrule (the paired loss check, `outcome`) before XLA is decided for it."""
    rates, cost, what = measured["rates"], measured["seconds"], timing.described(measured)
    verdicts = {p: verdict(p, measured) for p in policies}
    chosen = None
    if precision_open and len(policies) > 1:
        each = what.replace("passes,", "passes (each policy's with XLA where XLA won),", 1)
        chosen = policy_of(measured, policies, {p: v[0] for p, v in verdicts.items()}, each)
        chosen = judge(chosen) if judge is not None else chosen
    elif precision_open:
        chosen = PolicyChoice(policies[0], dtype_policies.candidates()[1])
    policy = chosen.policy if chosen is not None else policies[0]
    jit, why = verdicts.get(policy, (False, f"{policy} was not timed"))
    pairs = (("plain", (policy, False)), ("XLA", (policy, True)))
    figures = {k: rates[c] for k, c in pairs if c in rates}
    return chosen, XlaChoice(jit, f"{why}; measured on {what}", figures, cost_s=cost)


def policy_of(
    measured: dict, policies: list[str], jits: dict[str, bool], what: str
) -> PolicyChoice:
    """The policy from each one's step (jitted where `jits` says), `MIN_GAIN` faster than
    the first (float32) and told apart from it by the interleaved readings (`what` names
    the measurement in the reason)."""
    step = {p: (p, jits.get(p, False)) for p in policies}
    chosen = dtype_policies.decide(
        {p: measured["rates"][c] for p, c in step.items()}, "examples/s", what
    )
    if chosen.policy != policies[0]:
        tie = timing.tied(measured, step[policies[0]], step[chosen.policy])
        if tie:
            chosen = dataclasses.replace(
                chosen, value=policies[0], reason=f"{tie}; {chosen.reason}"
            )
    return dataclasses.replace(chosen, cost_s=measured["seconds"])


def speedup(
    model: keras.Model,
    loss: Callable[..., Any],
    strategy: tf.distribute.Strategy,
    feed: Feed,
    policy: str,
) -> tuple[float | None, str]:
    """XLA's speed on the model's passes under `policy`, timed as "auto" times it (copies
    of the model, one cached batch of `feed`, alternating rounds): `(with ÷ without XLA,
    "")`, or `(None, why)` when XLA cannot compile them. For the doctor and `tfaccel check`.

    Raises:
        ValueError: the model cannot be copied (the message says what to pass).
    """
    pair = [(policy, False), (policy, True)]
    timed = timing.time_steps(model, loss, strategy, feed, pair)
    if (policy, True) in timed["dropped"]:
        return None, timed["dropped"][(policy, True)]
    return timed["rates"][(policy, True)] / timed["rates"][(policy, False)], ""
