"""`resolve_fit`: every automatic choice of one `fit`, made once, in an order anyone can read.

The Trainer calls it after its input is checked, with what the choices need and nothing
else: the step (`Step`: model, loss, strategy, the model-building function, whether the
step loops exist), what is still "auto" (`Asked`) and the job (`Job`: the checked training
`Feed`, its length, the callbacks). In order:

1. **dtype policy and XLA**, the policy from one probe, its cost bounded by the *first*
   epoch (not the declared epochs: EarlyStopping may end the job early):
   - what may be timed: the policies this hardware offers (`policy.candidates`), unless
     the first epoch leaves no room for the paired loss check (`outcome.too_short`: the
     model's policy is kept, `policy.by_operations` names the operations' pick), and only
     when the first epoch can pay the probe back (`timing.too_short`, from the
     operations' rates);
   - one probe: the model's forward and backward passes on copies of the model and one
     cached batch under each policy (with and without XLA where XLA is probed), in
     interleaved rounds until a 95 % interval tells them apart or the rounds' budget ends
     (`timing.time_steps`, `readings.compare`: "no measurable difference" keeps the
     simpler setting); the policy from them (`xla.policy_of`);
   - judged by outcome: a faster policy changes the numerics, so it is adopted only
     when a paired check finds its training loss after the same first batches no worse
     than the kept policy's (`outcome.check`); otherwise the table says "faster steps,
     not adopted: the loss after N examples was X vs Y";
   - XLA is measured on the job's own steps where the job is long enough: where the
     model can take it (`xla.not_compilable`) and the first epoch holds both a probe of
     XLA alone (`timing.too_short_for_xla` for one policy: 100 steps) and, when the loop
     size is fixed, `timing.ONLINE_LOOPS` loops (`timing.online_fits`), the answer is
     "online" (`XlaChoice.online`): XLA is not probed, and the Runner's first loops
     alternate the plain and the XLA step under the chosen policy, every step training
     the model, until `readings.compare` decides (`online`). A job too short for that
     keeps the earlier rule: the probe above with each policy with and without XLA when
     its first epoch pays for it (`timing.too_short_for_xla`, `timing.admit`; XLA per
     policy, then the policy from each one's faster step: `xla.decide`), else the plain
     step, not measured, with the reason.

   After `evaluate` built the step loops, both are kept as they are.
2. **steps per loop**: a fixed value is the user's; "auto" is capped at one step a loop
   when a callback needs per-batch hooks (`loop_size.LoopSizer.honour_callbacks`), else
   measured over the first loops of training (`FitLoop` gives the sizer its timings).

Each answer is a `Choice` (value, reason, figures, cost); the Trainer applies them (a copy
of the model under the chosen policy, the step loops with or without XLA) and prints their
`describe()` in the settings table. "auto" never stops training: a model that cannot be
copied keeps its policy and the plain step, with the reason.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.choices import outcome, policy, timing, xla
from tfaccel.choices.choice import Choice
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.choices.policy import PolicyChoice
from tfaccel.choices.xla import XlaChoice

KEPT_AFTER_EVALUATE = "kept: evaluate ran before the first fit"
ONLINE = (
    f"{xla.ONLINE_PENDING} the plain and the XLA step (every step trains the model): the "
    "faster by a 95 % interval is kept, else the plain step"
)


@dataclasses.dataclass(frozen=True)
class Step:
    """The training step the choices are made for.

    Attributes:
        model: the model as the Trainer holds it (built on the input's spec if not).
        loss: the per-example loss.
        strategy: the `tf.distribute.Strategy`.
        builder: the user's model-building function (copies under a policy call it), or None.
        jit_compile: the step's XLA setting now.
        started: its step loops exist already (`evaluate` ran first): nothing changes.
        optimizer: the user's optimizer (the paired loss check trains copies of it; None:
            no other policy can be adopted).
    """

    model: keras.Model
    loss: Any
    strategy: tf.distribute.Strategy
    builder: Callable | None = None
    jit_compile: bool = False
    started: bool = False
    optimizer: Any = None


@dataclasses.dataclass(frozen=True)
class Asked:
    """Which choices are "auto" and not decided yet (each is made at the first fit)."""

    precision: bool = False
    jit_compile: bool = False

    def left(self, precision: Choice | None, jit_compile: Choice | None) -> Asked:
        """What is still to decide, given the choices an earlier fit made (None: none)."""
        return Asked(self.precision and precision is None, self.jit_compile and jit_compile is None)


@dataclasses.dataclass(frozen=True)
class Job:
    """One fit's job: its checked training input, its length and its callbacks.

    Attributes:
        feed: the training `tfaccel.data.Feed`, checked.
        steps_per_epoch: as given to `fit` (None: the feed's length).
        epochs: the epochs this fit trains.
        callbacks: the user's callbacks (per-batch hooks cap "auto" steps per loop).
    """

    feed: Any
    steps_per_epoch: int | None
    epochs: int
    callbacks: list = dataclasses.field(default_factory=list)

    @property
    def epoch_steps(self) -> int | None:
        """Steps of one epoch; None when unknown."""
        return self.steps_per_epoch or (self.feed.steps if self.feed.steps > 0 else None)

    @property
    def steps(self) -> int | None:
        """The job's training steps (epochs × steps per epoch); None when unknown."""
        epoch = self.epoch_steps
        return epoch * max(self.epochs, 0) if epoch else None

    @property
    def probe_feed(self) -> Any:
        """What the probe reads: a dataset function through a second build
        (`Feed.rebuilt`: reading the training build would draw its shuffle's first seeds
        and move the training order), a dataset as it is."""
        return self.feed.rebuilt() if self.feed.is_function else self.feed


@dataclasses.dataclass(frozen=True)
class Resolved:
    """One fit's automatic choices; None for what was not "auto" or was decided before."""

    precision: PolicyChoice | None
    jit_compile: XlaChoice | None
    steps_per_loop: Choice


def resolve_fit(step: Step, asked: Asked, job: Job, sizer: LoopSizer) -> Resolved:
    """Makes this fit's automatic choices in the module's order (see its docstring)."""
    sizer.honour_callbacks(job.callbacks)
    chosen, jit = _policy_and_xla(step, asked, job, 1 if sizer.capped else sizer.chosen)
    return Resolved(chosen, jit, sizer.choice(job.steps_per_epoch))


def _policy_and_xla(step: Step, asked: Asked, job: Job, loop_steps: int | None) -> tuple:
    """`(PolicyChoice or None, XlaChoice or None)`: step 1 of `resolve_fit` (`loop_steps`:
    the steps of a loop when fixed, None while "auto" measures them)."""
    model = step.model
    kept = model.dtype_policy.name
    if not (asked.precision or asked.jit_compile) or step.started:
        return (
            PolicyChoice(kept, KEPT_AFTER_EVALUATE) if asked.precision else None,
            XlaChoice(step.jit_compile, KEPT_AFTER_EVALUATE) if asked.jit_compile else None,
        )
    policies, why = policy.candidates() if asked.precision else ([kept], "")
    epoch_steps = job.epoch_steps
    unchecked = outcome.too_short(epoch_steps) if len(policies) > 1 else None
    held = None  # the policy answer when no other policy can be adopted
    if unchecked:  # no room for the paired check: other policies are not even timed
        ops = policy.operations_choice(step.strategy) if epoch_steps else None
        held = policy.by_operations(kept, unchecked, ops) if ops else None
        held = held or PolicyChoice(kept, f"kept: not measured ({unchecked})")
        policies = [kept]
    unfit = asked.jit_compile and xla.not_compilable(model)
    online = asked.jit_compile and not unfit and timing.online_fits(epoch_steps, loop_steps)
    no_xla = unfit or (
        asked.jit_compile and not online and timing.too_short_for_xla(epoch_steps, len(policies))
    )
    untimed = XlaChoice(False, f"not measured: {no_xla}") if no_xla else None
    if online:  # the first loops of training decide it (`online`): not probed
        untimed = XlaChoice(False, ONLINE, online=True)
    with_xla = asked.jit_compile and not no_xla and not online
    if not with_xla:  # policies alone, when they can pay the probe back
        if held is not None or len(policies) == 1:
            return (held or PolicyChoice("float32", why)) if asked.precision else None, untimed
        ops = policy.operations_choice(step.strategy) if epoch_steps is not None else None
        short = timing.too_short(policies, epoch_steps, ops)
        if short:
            return policy.by_operations(kept, short, ops), untimed
    candidates = [(p, False) for p in policies]
    candidates += [(p, True) for p in policies] if with_xla else []
    began = time.perf_counter()
    try:
        measured = timing.time_steps(
            model,
            step.loss,
            step.strategy,
            job.probe_feed,
            candidates,
            builder=step.builder,
            epoch_steps=epoch_steps,
            admit=lambda first: timing.admit(first, epoch_steps, time.perf_counter() - began),
        )
    except ValueError as error:  # "auto" never stops training: the model is kept as it is
        reason = f"kept: not measured ({error})"
        chosen = PolicyChoice(kept, reason) if asked.precision else None
        return chosen, (XlaChoice(False, reason) if with_xla else untimed)
    judge = _judge(step, job, kept)
    if with_xla:
        chosen, jit = xla.decide(measured, policies, asked.precision, judge)
        return (held if asked.precision and held is not None else chosen), jit
    jits = dict.fromkeys(policies, False)
    return judge(xla.policy_of(measured, policies, jits, timing.described(measured))), untimed


def _judge(step: Step, job: Job, kept: str) -> Callable[[PolicyChoice], PolicyChoice]:
    """The paired loss check (`outcome`) of a faster policy against `kept`."""

    def judge(chosen: PolicyChoice) -> PolicyChoice:
        if chosen.policy == kept:
            return chosen
        feed = job.probe_feed
        run = lambda steps: outcome.paired_losses(  # noqa: E731
            step.model, step.loss, step.strategy, feed, [kept, chosen.policy],
            optimizer=step.optimizer, steps=steps, builder=step.builder,
        )  # fmt: skip
        batch = job.feed.global_batch
        result = outcome.check(chosen.policy, kept, run, job.epoch_steps, batch, step.strategy)
        cost = chosen.cost_s + result.cost_s
        if result.adopted:
            return dataclasses.replace(
                chosen, reason=f"{chosen.reason}; {result.reason}", cost_s=cost
            )
        reason = f"{result.reason}; {chosen.policy}: {chosen.reason}"
        return dataclasses.replace(chosen, value=kept, reason=reason, cost_s=cost)

    return judge
