"""Judged by outcome: the doctor's precision fix checked on the job's own model and batches.

A lower precision changes the numerics: faster steps can cost epochs (issue 67: on
keras.io's timeseries FCN, `mixed_bfloat16` measured 1.08x float32's steps and took
longer to its target). So once the doctor measures another policy's passes faster by
`verdict.MIN_GAIN` or more, it runs the Trainer's own paired loss check
(`choices.outcome`: copies of the model from the same weights, a fresh copy of the
optimizer each, the same first batches of the job's data in the same order, random
states put back) and records its verdict on `Measured.precision_outcome`; the fix then
says "the loss after N examples was X vs Y" and is ranked by it (`verdict.Fix`). The
check trains `outcome.check_steps` of the first epoch a setting (at most 5 % of it, 8 to
100 steps), `outcome.MIN_STEPS` where the epoch is too short or unknown.

A larger batch or accumulation is not checked here: the paired check compares two
settings on the same batches, which a different batch does not share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfaccel.choices import outcome
from tfaccel.data.assembly.feed import Feed
from tfaccel.doctor import verdict as rules

if TYPE_CHECKING:
    from tfaccel.train.step.runner_interface import RunnerInterface


def check_precision(runner: RunnerInterface, feed: Feed, measured: rules.Measured) -> list[str]:
    """Runs the paired loss check of the fastest other policy against the current one,
    when its passes measured fast enough to be listed; sets `measured.precision_outcome`.
    Returns notes (a check that could not run: why; its fix stays unchecked)."""
    found = measured.precision_speedup()
    if found is None or found[1] < rules.MIN_GAIN or runner.loss is None:
        return []
    policy, kept = found[0], measured.dtype_policy
    steps = outcome.check_steps(measured.epoch_steps) or outcome.MIN_STEPS

    def run(n: int) -> dict[str, list[float]]:
        return outcome.paired_losses(
            runner.model,
            runner.loss,
            runner.strategy,
            feed,
            [kept, policy],
            optimizer=runner.optimizer,
            steps=n,
        )

    result = outcome.check(
        policy, kept, run, measured.epoch_steps, feed.global_batch, runner.strategy, steps
    )
    if not result.examples:  # not run: unchecked, not worse
        why = result.reason.removeprefix(f"{outcome.NOT_ADOPTED}: ")
        return [f"Precision: the paired loss check of {policy} did not run: {why}"]
    measured.precision_outcome = {
        "policy": policy,
        "adopted": result.adopted,
        "reason": result.reason,
        "examples": result.examples,
        "losses": dict(result.losses),
        "cost_s": result.cost_s,
    }
    return []
