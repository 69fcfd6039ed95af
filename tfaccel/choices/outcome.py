"""Judged by outcome: a faster policy that changes the numerics is adopted only when a
paired check shows it does not cost the path to accuracy.

Faster steps can cost epochs: on keras.io's timeseries FCN, `mixed_bfloat16` measured
1.08x float32's steps and needed 9, 10, 7 epochs to its target instead of 7, 6, 7. So
once the step probe (`timing`) finds another policy faster, `check` trains a copy of the
model under the kept policy and one under the faster one, from the same weights, with a
fresh copy of the user's optimizer each, on the same first `steps` batches in the same
order (one read of the data, each batch training both in turn; Python's, NumPy's and
TensorFlow's random states put back after), and
`verdict` compares their training losses over the last `WINDOW` of those steps, batch by
batch: the faster policy is not adopted when its loss is higher by more than `TOLERANCE`
of the kept one's *and* by more than the batch-to-batch noise (the `readings.interval`
of the paired differences excludes zero). The settings table then says "faster steps,
not adopted: the loss after N examples was X vs Y".

Its cost is bounded by the first epoch, not the declared epochs (a 150-epoch script with
EarlyStopping stops after a few): both settings together train at most `SHARE` of the
first epoch's steps, `MIN_STEPS` to `MAX_STEPS` each; a first epoch too short for
`MIN_STEPS` each leaves the kept policy (`too_short`), and the step probe is then not run
for policies at all.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfaccel.choices.agreement import agree
from tfaccel.choices.copies import random_states_kept, under
from tfaccel.choices.readings import interval
from tfaccel.data.elements import unpack

SHARE = 0.05  # both settings' check steps: at most this share of the first epoch's steps
MIN_STEPS = 8  # per setting: fewer leaves too few losses to tell noise from a cost
MAX_STEPS = 100  # per setting: enough for the window's noise, bounded on long epochs
WINDOW = 0.5  # the losses compared: the last half of the check's steps
TOLERANCE = 0.02  # a loss this much (relative) higher is equal: 16-bit rounding (xla.py)
NOT_ADOPTED = "faster steps, not adopted"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The paired check's verdict.

    Attributes:
        adopted: whether the faster setting keeps the path (its loss no worse).
        examples: the examples each setting trained on.
        losses: each setting's mean training loss over the compared window.
        reason: one line, naming both losses and the noise.
        cost_s: what the check took, in seconds.
    """

    adopted: bool
    examples: int
    losses: dict
    reason: str
    cost_s: float = 0.0


def check_steps(epoch_steps: int | None) -> int | None:
    """Steps each setting trains in the check (None: the first epoch is too short or
    unknown)."""
    if not epoch_steps:
        return None
    steps = int(SHARE * epoch_steps) // 2
    return min(steps, MAX_STEPS) if steps >= MIN_STEPS else None


def too_short(epoch_steps: int | None) -> str | None:
    """Why a first epoch of `epoch_steps` leaves no room for the check (None: it has)."""
    if check_steps(epoch_steps) is not None:
        return None
    least = math.ceil(2 * MIN_STEPS / SHARE)
    if not epoch_steps:
        return "the first epoch's length is unknown (pass steps_per_epoch)"
    return (
        f"a first epoch of {epoch_steps} steps is too short for the paired loss check "
        f"({MIN_STEPS} steps a setting, both within {SHARE:.0%} of it); from {least} "
        "steps an epoch up it is checked"
    )


def verdict(
    reference: str, candidate: str, losses: Mapping[str, Sequence[float]], examples: int
) -> Outcome:
    """Whether `candidate` keeps the path: its per-step losses (same batches, same order
    as `reference`'s) over the last `WINDOW` are not higher by more than `TOLERANCE` and
    the noise.

    Raises:
        ValueError: the two settings' losses differ in length or are fewer than 2.
    """
    ref, cand = list(losses[reference]), list(losses[candidate])
    if len(ref) != len(cand) or len(ref) < 2:
        raise ValueError(f"paired losses need equal lengths >= 2, got {len(ref)} and {len(cand)}")
    window = max(2, math.ceil(WINDOW * len(ref)))
    ref, cand = ref[-window:], cand[-window:]
    mean_ref, mean_cand = statistics.fmean(ref), statistics.fmean(cand)
    gap = mean_cand - mean_ref
    low, high = interval([c - r for c, r in zip(cand, ref, strict=True)])
    bound = TOLERANCE * abs(mean_ref)
    means = {reference: mean_ref, candidate: mean_cand}
    noise = f"the paired gap {gap:+.3g}, {interval_text(low, high)} over the last {window} batches"
    after = f"the loss after {examples:,} examples was {mean_cand:.4g} vs {mean_ref:.4g}"
    if math.isfinite(mean_cand) and (gap <= bound or not low > 0):
        why = f"{candidate} {after} ({reference}); {noise}: within {TOLERANCE:.0%} or the noise"
        return Outcome(True, examples, means, why)
    return Outcome(
        False,
        examples,
        means,
        f"{NOT_ADOPTED}: {after} ({candidate} vs {reference}); {noise}",
    )


def interval_text(low: float, high: float) -> str:
    """`95% interval [low, high]` (unbounded below two readings)."""
    if not math.isfinite(low):
        return "no interval"
    return f"95% interval [{low:+.3g}, {high:+.3g}]"


def paired_losses(
    model: keras.Model,
    loss: Callable[..., Any],
    strategy: tf.distribute.Strategy,
    feed: Any,
    policies: Sequence[str],
    *,
    optimizer: keras.optimizers.Optimizer | None,
    steps: int,
    builder: Callable | None = None,
) -> dict[str, list[float]]:
    """Each policy's training losses over the feed's first `steps` batches, from the
    model's weights and a fresh copy of `optimizer` (loss-scaled under float16); the data
    is read once, each batch training every setting in turn, and the random states are
    put back after.

    Raises:
        ValueError: the model or the optimizer cannot be copied, or none was given, or
            the data holds fewer than `steps` batches (the message says why).
    """
    if optimizer is None:
        raise ValueError("no optimizer was given to train the check with")
    first = feed.mapped(lambda ds: ds.take(steps))
    with random_states_kept(), strategy.scope():
        trained = {}
        for p in policies:
            copy = under(model, p, builder)
            trained[p] = _train_step(copy, loss, strategy, _fresh(optimizer, p))
        out: dict[str, list[float]] = {p: [] for p in policies}
        for batch in first.distribute():  # one read: each batch trains every setting
            for p, step in trained.items():
                out[p].append(float(step(batch)))
    if any(len(v) != steps for v in out.values()):
        raise ValueError(f"the data holds fewer than the check's {steps} batches")
    return out


def _fresh(optimizer: Any, policy: str) -> keras.optimizers.Optimizer:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    try:
        fresh = type(inner).from_config(inner.get_config())
    except Exception as error:  # noqa: BLE001 - re-raised with what to do
        raise ValueError(
            f"the optimizer {type(inner).__name__} cannot be copied from its config ({error})"
        ) from error
    if "float16" in policy and "bfloat16" not in policy:
        return keras.optimizers.LossScaleOptimizer(fresh)
    return fresh


def _train_step(model, loss, strategy, optimizer) -> Callable:
    optimizer.build(model.trainable_variables)

    def replica(data):
        x, y, sample_weight = unpack(data)
        with tf.GradientTape() as tape:
            per_example = loss(y, model(x, training=True), sample_weight)
            value = tf.nn.compute_average_loss(per_example)
            scaled = optimizer.scale_loss(value)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return tf.cast(value, tf.float32)

    return tf.function(
        lambda data: strategy.reduce("SUM", strategy.run(replica, args=(data,)), axis=None)
    )


def check(
    chosen: str,
    kept: str,
    run: Callable[[int], dict[str, list[float]]],
    epoch_steps: int | None,
    batch: int | None,
    strategy: tf.distribute.Strategy | None = None,
    steps: int | None = None,
) -> Outcome:
    """The paired check of `chosen` against `kept`: `run(steps)` returns both settings'
    per-step losses (`paired_losses`), `steps` a setting (default: `check_steps` of the
    first epoch; the doctor, which trains nothing after, passes its own). A first epoch
    too short, or a check that cannot run, does not adopt `chosen` (the reason says why;
    `examples` is 0: unchecked)."""
    steps = check_steps(epoch_steps) if steps is None else steps
    if steps is None:
        return Outcome(False, 0, {}, f"{NOT_ADOPTED}: {too_short(epoch_steps)}")
    began = time.perf_counter()
    try:
        losses = run(steps)
    except ValueError as error:
        return Outcome(
            False, 0, {}, f"{NOT_ADOPTED}: the paired loss check could not run ({error})"
        )
    result = verdict(kept, chosen, losses, steps * (batch or 1))
    rejected = agree(strategy, float(not result.adopted)) if strategy is not None else 0.0
    if rejected and result.adopted:  # every worker adopts alike
        why = f"{NOT_ADOPTED}: another worker's check found a cost"
        result = dataclasses.replace(result, adopted=False, reason=why)
    cost = time.perf_counter() - began
    said = f"{result.reason} (the check: {steps} steps a setting, {cost:.1f} s)"
    return dataclasses.replace(result, reason=said, cost_s=cost)
