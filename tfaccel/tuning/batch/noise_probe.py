"""`find_batch_size`'s noise-scale step: a short warm-up, then B_simple, within the budget.

The noise scale grows as the loss falls (McCandlish et al. 2018, section 3): measured
at the initial weights it is at its smallest. The step therefore first trains the
probes' model (or a fresh one if the last probe failed) on the shuffled data for a
warm-up, then estimates B_simple (`gradient_noise_scale`, traced once for both batch
sizes, stopping early once its relative standard error is at most `TOLERANCE`) at the
warmed weights. The warm-up runs at the batch the search would choose but for the
noise scale (the throughput knee), with the optimizer as given: it gets as far into
training as its time allows, and a batch past the critical batch gains less per
example there, so the noise scale it reads stays small and the bound still holds.
The note gives the warm-up's share of the job (with `job_examples`): on the CIFAR-shaped
CNN job the noise scale and an equal-time race both favoured batch 32 until about one pass,
a tenth of that job, and the larger batches after it (`benchmarks/batch_size_signals.py`).
The batch is bounded by the largest B_simple the estimate supports (`NoiseStep.bound`,
`noise.upper_limit`); an estimate whose relative standard error reaches `noise.MAX_ERROR`
supports any, and is reported, not applied (`NoiseStep.reliable`). On a CIFAR-shaped
MLP job (`benchmarks/batch_size_jobs.py`; B_simple ≈ 500, measured with batches of 8
and 64) a reading of 7, of that kind, had kept the batch at 32, while the throughput
knee, 64, reached batch 32's accuracy in 0.25× its time.

Its cost is predicted from the candidates' own measurements: one fixed cost (a trace,
as the probes took; two with a fresh build) plus the estimate's examples (all its
batches) at the examples/s measured at its two batches, plus the warm-up's examples at
the rate measured at the warm-up batch. While candidates are probed, `reserve` keeps
that cost free: a candidate is not started when it would eat into it. The warm-up gets
what the limit leaves after the estimate (its reserve: at most `NOISE_SHARE` of the
limit); if not even the estimate fits, it is skipped and the report says so.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from typing import Any

import tensorflow as tf

from tfaccel.data.order.augment_seeds import without_global_seed
from tfaccel.tuning.batch.budget import NOISE_SHARE, TimeLimit, fixed_seconds, rate_at
from tfaccel.tuning.batch.noise import MAX_ERROR, error_text, gradient_noise_scale, upper_limit
from tfaccel.tuning.batch.report import ProbeRow
from tfaccel.tuning.oom import is_out_of_memory, release_memory

logger = logging.getLogger("tfaccel")

WARMUP_EXAMPLES = 50_000  # without a time limit: one pass over at most this many
BATCHES = 16  # big batches averaged at most (and 8x as many small ones)
TOLERANCE = 0.1  # the estimate's relative standard error at which the draws stop


@dataclasses.dataclass(frozen=True)
class NoiseStep:
    """What the noise-scale step did: the estimate (None if skipped), its error, a note."""

    b_simple: float | None
    warmup_examples: int
    seconds_estimate: float
    note: str
    relative_error: float | None = None

    @property
    def reliable(self) -> bool:
        """Whether the estimate may bound the batch: measured, error < `MAX_ERROR`."""
        return self.b_simple is not None and math.isfinite(self.bound)

    @property
    def bound(self) -> float:
        """The largest B_simple the estimate supports (`noise.upper_limit`; inf: none)."""
        if self.b_simple is None:
            return math.inf
        return upper_limit(self.b_simple, self.relative_error)


def plan(
    rows: list[ProbeRow],
    steps: int,
    examples: int | None,
    largest: int,
    knee: int,
    fresh: bool = False,
) -> tuple[int, int, float]:
    """(small, big, predicted seconds of the estimate itself, without the warm-up).

    `largest` is per device; `fresh`: no probe's model to reuse (one more build and trace).
    """
    big = min(largest, examples or largest, max(knee, 64))
    small = max(1, min(8, big // 4))
    fitted = [fixed_seconds(r, steps) for r in rows if r.fits]
    fixed = statistics.mean(fitted) if fitted else 0.0
    seconds = (2 if fresh else 1) * fixed
    for size, count in ((small, 8 * BATCHES), (big, BATCHES)):
        rate = rate_at(rows, size)
        seconds += count * size / rate if rate else 0.0
    return small, big, seconds


def _warmup_plan(search, knee: int, warmup: int | None) -> tuple[int, int, float]:
    """(warm-up batch, examples asked for, examples/s measured at that batch)."""
    examples = search.examples
    warm_batch = max(1, min(knee, examples or knee))
    if warmup is None:
        warmup = min(examples or WARMUP_EXAMPLES, WARMUP_EXAMPLES)
    return warm_batch, warmup, rate_at(search.rows, warm_batch) or 0.0


def reserve(search: Any, batch: int, limit: float) -> float:
    """Seconds to keep for the noise scale should `batch` be the largest and the knee.

    The estimate's predicted cost, plus its warm-up's up to `NOISE_SHARE` of `limit` —
    the warm-up's only once a candidate above the first has run: until then the noise
    scale has no increase to bound, and the next candidate comes first.
    """
    per_device = max(1, batch // search.strategy.num_replicas_in_sync)
    if min(per_device, search.examples or per_device) < 2:
        return 0.0
    _, _, seconds = plan(search.rows, search.steps, search.examples, per_device, batch)
    if sum(1 for r in search.rows if r.fits) < 2:
        return seconds
    _, warmup, warm_rate = _warmup_plan(search, batch, search.noise_warmup)  # batch: the knee
    warm_seconds = warmup / warm_rate if warm_rate else 0.0
    if search.noise_warmup is None:  # the warm-up shrinks to what is left
        warm_seconds = min(warm_seconds, max(0.0, NOISE_SHARE * limit - seconds))
    return seconds + warm_seconds


def measure(
    search: Any, limit: TimeLimit, largest: int, knee: int, warmup: int | None
) -> NoiseStep:
    """Warms the last probe's model up and estimates B_simple, within what `limit` leaves."""
    rows, examples = search.rows, search.examples
    # The estimate runs on one device, outside the strategy: a replica's share at most.
    per_device = max(1, largest // search.strategy.num_replicas_in_sync)
    big_max = min(per_device, examples or per_device)
    if big_max < 2:
        return NoiseStep(math.inf, 0, 0.0, "one example per batch: nothing to compare")
    model, search.last_model = search.last_model, None
    small, big, seconds = plan(rows, search.steps, examples, per_device, knee, model is None)
    warm_batch, asked, warm_rate = _warmup_plan(search, knee, warmup)
    left = limit.left(rows)
    if warmup is None and left is not None:
        asked = min(asked, int(max(0.0, left - seconds) * warm_rate))
    if left is not None and seconds > left:
        note = (
            f"not measured: its estimated {seconds:.1f} s exceed the {max(left, 0):.1f} s "
            "left of the search's time limit"
        )
        logger.info("find_batch_size: noise scale %s", note)
        return NoiseStep(None, 0, seconds, note)
    total = seconds + (asked / warm_rate if warm_rate else 0.0)
    logger.info(
        "find_batch_size: noise scale after %d warm-up examples, estimated %.1f s", asked, total
    )
    try:
        if model is None:
            model = search._build()
        warm_steps = asked // warm_batch
        if warm_steps:
            with without_global_seed():  # the same warm-up whatever global seed is set
                shuffled = search.data.shuffle(min(examples or 10_000, 10_000), seed=0).repeat()
            model.fit(
                shuffled.batch(warm_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE),
                epochs=1,
                steps_per_epoch=warm_steps,
                shuffle=False,  # shuffled above
                verbose=0,
            )
        estimate = gradient_noise_scale(
            model,
            search.data,
            search.loss,
            small=small,
            big=big,
            batches=BATCHES,
            tolerance=TOLERANCE,
        )
    except Exception as error:  # noqa: BLE001 - only out-of-memory is caught
        if not is_out_of_memory(error):
            raise
        note = f"not measured: batch {big} ran out of memory on one device ({type(error).__name__})"
        logger.info("find_batch_size: noise scale %s", note)
        return NoiseStep(None, 0, seconds, note)
    finally:
        del model
        release_memory()
    logger.info("find_batch_size: %s", estimate)
    job = search.time_limit.job_examples
    share = f" ({_percent(warm_steps * warm_batch / job)} of the job's {job:,})" if job else ""
    note = (
        f"after a warm-up of {warm_steps * warm_batch:,} examples{share} at batch {warm_batch}; "
        f"{estimate.batches} batches of {big}, {estimate.small_batches} of {small}; "
        f"relative standard error {error_text(estimate.relative_error)}"
    )
    if not estimate.reliable:
        note += f" (from {MAX_ERROR:.0%} on: too noisy to bound the batch, not applied)"
    examples_seen = warm_steps * warm_batch
    return NoiseStep(estimate.b_simple, examples_seen, total, note, estimate.relative_error)


def _percent(share: float) -> str:
    """A share as a percentage: two significant digits below 10 %, whole ones above."""
    percent = 100 * share
    return f"{percent:.2g} %" if percent < 10 else f"{percent:.0f} %"
