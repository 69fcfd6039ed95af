"""From a `BatchSizeReport` to the batch and learning rate to train a job with.

Example:
    >>> choice = tfaccel.tuning.recommend(                            # doctest: +SKIP
    ...     report, batch_size=32, learning_rate=1e-3, optimizer="adam")
    >>> choice.batch_size, choice.learning_rate, choice.reason
    >>> trainer = tfaccel.Trainer(build, optimizer=keras.optimizers.Adam(choice.learning_rate),
    ...                           methods=list(choice.methods), ...)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfaccel.methods.schedules import OneCycle
from tfaccel.tuning.batch.report import BatchSizeReport
from tfaccel.tuning.scaling import resolve_lr_scaling, scaled_learning_rate


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The batch and learning rate to train with, and why.

    Attributes:
        batch_size: the global batch (a multiple of the replicas).
        learning_rate: the user's rate scaled to it by `rule` (the user's when kept).
        rule: "linear" (SGD: warm up with `callbacks.LinearScalingWarmup`), "sqrt"
            (adaptive optimizers) or None.
        kept: True when the user's batch and rate are kept as they were.
        reason: one line saying why.
        methods: the `tfaccel.methods` to train the larger batch with (for `Trainer(...,
            methods=)` or `methods.for_fit`): under the square-root rule, one-cycle
            peaking at `CYCLE_SCALE` x `learning_rate`, sized to the job's steps; empty
            when the batch is kept or the rate is not scaled by the square root.
    """

    batch_size: int
    learning_rate: float
    rule: str | None
    kept: bool
    reason: str
    methods: tuple = ()


CYCLE_SCALE = 3.0
"""The one-cycle peak a grown batch's recommendation trains with, × its scaled rate: a
larger batch pays once the schedule is sized to its steps (set by
`benchmarks/batch_size_seeds.py`, results `benchmarks/results/batch_size_seeds.cycle.json`;
the figures in docs/how-to/batch-size.md)."""


def recommend(
    report: BatchSizeReport,
    *,
    batch_size: int,
    learning_rate: float,
    optimizer: Any,
    lr_scaling: str | None = "auto",
    replicas: int = 1,
) -> Recommendation:
    """The report's best batch with the user's rate scaled to it — or the user's own.

    The user's batch and rate are kept when it already leaves fewer than the report's
    steps per epoch (that rule stops an increase; lowering the batch for it measured
    slower, digits 1.05x the time to accuracy), when the search's
    time ran out before it timed any batch above `batch_size` (the job is too small
    for a probe to pay for itself), or when the report's best batch is no larger: the
    knee, the noise scale (measured early in training, when it is smallest) and the
    time to accuracy stop an increase but do not lower the user's batch. Otherwise the
    best batch (rounded down to a multiple of `replicas`), with `learning_rate` scaled
    from `batch_size` by the optimizer's rule (`rule_for`: linear for SGD, with a
    warm-up; square root for Adam and other adaptive optimizers).

    Raises:
        ValueError: a batch size < 1, a rate <= 0, or an unknown `lr_scaling`.
    """
    rule = resolve_lr_scaling(lr_scaling, optimizer)
    # Checks the numbers, whatever the outcome.
    scaled_learning_rate(
        batch_size, base_batch_size=batch_size, base_learning_rate=learning_rate, lr_scaling=None
    )
    timed_above = any(
        r.fits and r.examples_per_second and r.batch_size > batch_size for r in report.rows
    )
    steps_cap = report.limits.get("steps per epoch")
    if steps_cap is not None and steps_cap < batch_size:  # the data: no larger batch
        return Recommendation(
            batch_size,
            float(learning_rate),
            rule,
            True,
            f"batch {batch_size} already leaves fewer than {report.examples // steps_cap} "
            f"steps an epoch on {report.examples:,} examples: no larger batch; kept (a smaller "
            "one for the step count alone measured slower: 1.05x the time to accuracy)",
        )
    if report.capped_by == "time" and not timed_above:
        return Recommendation(
            batch_size,
            float(learning_rate),
            rule,
            True,
            f"the job is too small for a probe to pay for itself: its time budget ran out "
            f"at batch {report.max_batch_size}, before a batch above {batch_size} was timed"
            + (f" ({report.declined})" if report.declined else ""),
        )
    best = max(replicas, report.best_batch_size // replicas * replicas)
    why = "knee" if report.decided_by == "throughput knee" else report.decided_by
    if best <= batch_size:
        # Measured early in training, the noise scale is at its lowest (it grows as the
        # loss falls): it stops an increase but is no reason to lower the user's batch.
        return Recommendation(
            batch_size,
            float(learning_rate),
            rule,
            True,
            f"no larger batch pays: the {why} allows {report.best_batch_size}"
            f"{_limits(report)}; batch {batch_size} kept"
            + (f" ({report.compared})" if report.compared else ""),
        )
    reason = f"batch {best}, decided by the {why}{_limits(report)}{_against(report, batch_size)}"
    if report.compared:  # the knee's readings could not tell the larger batches apart
        reason += f"; the smaller kept: {report.compared}"
    if rule == "linear":
        reason += "; warm the rate up with callbacks.LinearScalingWarmup"
    return _scaled(best, batch_size, learning_rate, rule, reason)


def before_probing(
    *,
    batch_size: int,
    learning_rate: float,
    optimizer: Any,
    examples: int,
    min_steps_per_epoch: int = 20,
    lr_scaling: str | None = "auto",
    replicas: int = 1,
) -> Recommendation | None:
    """The choice when the data alone makes it, so that no probe is worth running; else None.

    When `examples // min_steps_per_epoch` is at most `batch_size`, no larger batch can be
    chosen whatever a probe measures: the user's batch and rate are kept (as `recommend`
    would; not lowered for the step count alone, which measured slower). Use it before
    `find_batch_size`, with `start=batch_size` when it returns None.

    Raises:
        ValueError: a batch size or examples < 1, or a rate <= 0.
    """
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples must be an integer >= 1, got {examples!r}.")
    rule = resolve_lr_scaling(lr_scaling, optimizer)
    scaled_learning_rate(
        batch_size, base_batch_size=batch_size, base_learning_rate=learning_rate, lr_scaling=None
    )
    cap = examples // min_steps_per_epoch
    if cap > batch_size:
        return None
    room = (
        f"no probe: {examples:,} examples leave no batch above {batch_size} with "
        f"{min_steps_per_epoch} steps an epoch (at most {cap})"
    )
    return Recommendation(batch_size, float(learning_rate), rule, True, f"{room}; kept")


def _against(report: BatchSizeReport, batch_size: int) -> str:
    """What the growth was read against, when not the user's batch: the knee is read again
    against the search's first candidate (`find_batch_size`'s `confirm`), so a search
    started elsewhere did not compare it with `batch_size` under noise (`tune` starts at
    the user's batch: the same job then gets the same answer)."""
    first = next((r.batch_size for r in report.rows if r.fits and r.examples_per_second), None)
    if first is None or first == batch_size:
        return ""
    return (
        f"; read against batch {first}, the search's first candidate, not your {batch_size}: "
        f"BatchSearch(start={batch_size}) (as tune searches) compares it with yours under noise"
    )


def _limits(report: BatchSizeReport) -> str:
    """The report's limits in parentheses, or nothing when it lists none (a report made
    by hand or read from an older file): never an empty "()"."""
    line = report.limits_line()
    return f" ({line})" if line else ""


def _scaled(batch, base_batch, base_rate, rule, reason) -> Recommendation:
    rate = scaled_learning_rate(
        batch, base_batch_size=base_batch, base_learning_rate=base_rate, lr_scaling=rule
    )
    if rule != "sqrt":
        return Recommendation(batch, rate, rule, False, reason)
    cycle = OneCycle(peak=CYCLE_SCALE * rate)
    reason += (
        f"; train it with .methods: one-cycle peaking at {CYCLE_SCALE:g}x that rate, sized to "
        "the job's steps (a larger batch without it measured slower to accuracy)"
    )
    return Recommendation(batch, rate, rule, False, reason, (cycle,))
