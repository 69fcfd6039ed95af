"""`find_batch_size`'s noise-scale step: a short warm-up, then B_simple, within the budget.

The noise scale grows as the loss falls (McCandlish et al. 2018, section 3): measured
at the initial weights it is at its smallest. The step therefore first trains a fresh
model on the shuffled data at batch 32 (Keras' default, with the optimizer as given)
for a warm-up, then estimates B_simple (`gradient_noise_scale`) at the warmed weights.
Even so it reads the noise scale early in training: a cautious bound.

Its cost is estimated before it starts from the candidates' own measurements: two
fixed costs (a model build and trace, as the probes took) plus the estimate's
examples at the examples/s measured at its two batches, plus the warm-up's examples
at the rate measured at the warm-up batch. Under a time limit the warm-up gets what
the limit leaves after the estimate; if not even the estimate fits, it is skipped
and the report says so.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

import tensorflow as tf

from tfaccel.tuning.budget import TimeLimit, fixed_seconds, rate_at
from tfaccel.tuning.noise import gradient_noise_scale
from tfaccel.tuning.oom import is_out_of_memory, release_memory
from tfaccel.tuning.report import ProbeRow

logger = logging.getLogger("tfaccel")

WARMUP_BATCH = 32
WARMUP_EXAMPLES = 10_000  # without a time limit: at most one pass over this many
BATCHES = 16  # big batches averaged (and 8x as many small ones)


@dataclasses.dataclass(frozen=True)
class NoiseStep:
    """What the noise-scale step did: the estimate (None if skipped) and a note."""

    b_simple: float | None
    warmup_examples: int
    seconds_estimate: float
    note: str


def plan(
    rows: list[ProbeRow], steps: int, examples: int | None, largest: int, knee: int
) -> tuple[int, int, float]:
    """(small, big, estimated seconds of the estimate itself, without the warm-up)."""
    big = min(largest, examples or largest, max(knee, 64))
    small = max(1, min(8, big // 4))
    fixed = statistics.mean(fixed_seconds(r, steps) for r in rows if r.fits) if rows else 0.0
    seconds = 2 * fixed
    for size, count in ((small, 8 * BATCHES), (big, BATCHES)):
        rate = rate_at(rows, size)
        seconds += count * size / rate if rate else 0.0
    return small, big, seconds


def measure(search, limit: TimeLimit, largest: int, knee: int, warmup: int | None) -> NoiseStep:
    """Warms a fresh model up and estimates B_simple, within what `limit` leaves."""
    rows, examples = search.rows, search.examples
    # The estimate runs on one device, outside the strategy: a replica's share at most.
    per_device = max(1, largest // search.strategy.num_replicas_in_sync)
    big_max = min(per_device, examples or per_device)
    if big_max < 2:
        return NoiseStep(math.inf, 0, 0.0, "one example per batch: nothing to compare")
    small, big, seconds = plan(rows, search.steps, examples, per_device, knee)
    warm_batch = min(WARMUP_BATCH, largest, examples or largest)
    warm_rate = rate_at(rows, warm_batch) or 0.0
    left = limit.left(rows)
    if warmup is None:
        warmup = min(examples or WARMUP_EXAMPLES, WARMUP_EXAMPLES)
        if left is not None:
            warmup = min(warmup, int(max(0.0, left - seconds) * warm_rate))
    if left is not None and seconds > left:
        note = (
            f"not measured: its estimated {seconds:.1f} s exceed the {max(left, 0):.1f} s "
            "left of the search's time limit"
        )
        logger.info("find_batch_size: noise scale %s", note)
        return NoiseStep(None, 0, seconds, note)
    total = seconds + (warmup / warm_rate if warm_rate else 0.0)
    logger.info(
        "find_batch_size: noise scale after %d warm-up examples, estimated %.1f s", warmup, total
    )
    model = search._build()
    try:
        warm_steps = warmup // warm_batch
        if warm_steps:
            shuffled = search.data.shuffle(min(examples or 10_000, 10_000), seed=0).repeat()
            model.fit(
                shuffled.batch(warm_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE),
                epochs=1,
                steps_per_epoch=warm_steps,
                shuffle=False,  # shuffled above
                verbose=0,
            )
        estimate = gradient_noise_scale(
            model, search.data, search.loss, small=small, big=big, batches=BATCHES
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
    note = f"after a warm-up of {warm_steps * warm_batch:,} examples at batch {warm_batch}"
    return NoiseStep(estimate.b_simple, warm_steps * warm_batch, total, note)
