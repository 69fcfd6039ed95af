"""`resolve`: every automatic choice of one `fit`, made once, in one order anyone can read.

The Trainer calls it after its input is checked (`Trainer.fit`), with what the choices
need and nothing else: the step (`Step`: model, loss, strategy, the model-building
function, whether the step loops exist), what is still "auto" (`Asked`) and the job
(`Job`: the checked training `Feed`, its length, the callbacks). In order:

1. **dtype policy and XLA**, together: one probe times the model's forward and backward
   passes under each candidate policy (`policy.candidates`), with and without XLA when
   `jit_compile="auto"` (`xla`), on copies of the model and one cached batch (`timing`),
   within 5 % of the job; a job too short for it takes what the operations' rates say
   (`step_policy`), or keeps the model's policy and the plain step, with the reason.
   After `evaluate` built the step loops, both are kept as they are.
2. **steps per loop**: a fixed value is the user's; "auto" is capped at one step a loop
   when a callback needs per-batch hooks (`loop_size.LoopSizer.honour_callbacks`), else
   measured over the first loops of training (`FitLoop` feeds the sizer its timings).

Each answer is a `Choice` (value, reason, figures, cost); the Trainer applies them (a copy
of the model under the chosen policy, the step loops with or without XLA) and prints their
`describe()` in the settings table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.choices import policy, step_policy, timing, xla
from tfaccel.choices.choice import Choice
from tfaccel.choices.copies import build_symbolically
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.choices.policy import PolicyChoice
from tfaccel.choices.xla import XlaChoice

KEPT_AFTER_EVALUATE = "kept: evaluate ran before the first fit"


@dataclasses.dataclass(frozen=True)
class Step:
    """The training step the choices are made for.

    Attributes:
        model: the model as the Trainer holds it (built here on the input's spec if not).
        loss: the per-example loss.
        strategy: the `tf.distribute.Strategy`.
        builder: the user's model-building function (copies under a policy call it), or None.
        jit_compile: the step's XLA setting now.
        started: its step loops exist already (`evaluate` ran first): nothing changes.
    """

    model: keras.Model
    loss: Any
    strategy: tf.distribute.Strategy
    builder: Callable | None = None
    jit_compile: bool = False
    started: bool = False


@dataclasses.dataclass(frozen=True)
class Asked:
    """Which choices are "auto" and not decided yet (each is made at the first fit)."""

    precision: bool = False
    jit_compile: bool = False


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


@dataclasses.dataclass(frozen=True)
class Resolved:
    """One fit's automatic choices; None for what was not "auto" or was decided before."""

    precision: PolicyChoice | None
    jit_compile: XlaChoice | None
    steps_per_loop: Choice


def resolve(step: Step, asked: Asked, job: Job, sizer: LoopSizer) -> Resolved:
    """Makes this fit's automatic choices in the module's order (see its docstring)."""
    chosen, jit = _policy_and_xla(step, asked, job)
    sizer.honour_callbacks(job.callbacks)
    return Resolved(chosen, jit, sizer.choice(job.steps_per_epoch))


def _policy_and_xla(step: Step, asked: Asked, job: Job) -> tuple:
    """`(PolicyChoice or None, XlaChoice or None)`: one probe for both (see `resolve`)."""
    if not (asked.precision or asked.jit_compile):
        return None, None
    model = step.model
    if step.started:  # evaluate ran first: the step exists already
        return (
            PolicyChoice(model.dtype_policy.name, KEPT_AFTER_EVALUATE) if asked.precision else None,
            XlaChoice(step.jit_compile, KEPT_AFTER_EVALUATE) if asked.jit_compile else None,
        )
    policies = policy.candidates()[0] if asked.precision else [model.dtype_policy.name]
    why = xla.not_measured(model, job.steps, len(policies)) if asked.jit_compile else None
    unmeasured = XlaChoice(False, f"not measured: {why}") if asked.jit_compile else None
    if asked.jit_compile and not why:
        return _measured(step, job, policies, asked.precision)
    if not asked.precision:
        return None, unmeasured
    with step.strategy.scope():
        if not model.built or not model.weights:
            build_symbolically(model, job.feed.element_spec[0])
    try:
        chosen = step_policy.choose(
            model,
            step.loss,
            step.strategy,
            _probe_feed(job.feed),
            builder=step.builder,
            epoch_steps=job.epoch_steps,
            job_steps=job.steps,
        )
    except ValueError as error:  # "auto" never stops training: the policy is kept
        chosen = PolicyChoice(model.dtype_policy.name, f"kept: not measured ({error})")
    return chosen, unmeasured


def _measured(step: Step, job: Job, policies: list[str], precision_open: bool) -> tuple:
    """Times `policies` with and without XLA and decides both (`xla.decide`); a model that
    cannot be copied is kept as it is, with the reason."""
    model, strategy = step.model, step.strategy
    with strategy.scope():
        if not model.built or not model.weights:
            build_symbolically(model, job.feed.element_spec[0])
    candidates = [(p, False) for p in policies] + [(p, True) for p in policies]
    began = time.perf_counter()
    steps, epoch_steps = job.steps or 0, job.epoch_steps
    try:
        measured = timing.time_steps(
            model,
            step.loss,
            strategy,
            _probe_feed(job.feed),
            candidates,
            builder=step.builder,
            epoch_steps=epoch_steps,
            admit=lambda first: xla.admit(first, steps, epoch_steps, time.perf_counter() - began),
        )
    except ValueError as error:
        kept = f"kept: not measured ({error})"
        chosen = PolicyChoice(model.dtype_policy.name, kept) if precision_open else None
        return chosen, XlaChoice(False, kept)
    return xla.decide(measured, policies, precision_open)


def _probe_feed(feed):
    """The feed the probe reads: a dataset function through a second build
    (`Feed.rebuilt`), as reading the training build would draw its shuffle's first seeds
    and move the training order; a dataset as it is."""
    return feed.rebuilt() if feed.is_function else feed
