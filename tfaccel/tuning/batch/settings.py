"""`BatchSearch`: how `find_batch_size` searches — its candidates, their timing, its rules.

Example:
    >>> search = tfaccel.tuning.BatchSearch(start=32, limit=1024, knee=0.1)  # doctest: +SKIP
    >>> report = tfaccel.tuning.find_batch_size(job, search=search)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tfaccel.tuning.batch.probes import check_int

MODES = ("power", "binsearch")


@dataclasses.dataclass(frozen=True)
class BatchSearch:
    """The batch-size search's settings: which candidates, how each is timed, which rules
    choose among them (the job searched is a `TuningJob`).

    Attributes:
        start: the first candidate.
        limit: the largest batch to try; None → only memory limits it.
        mode: "power" (powers of two times `start`) or "binsearch".
        granularity: "binsearch" resolves the largest fitting batch to a multiple of this.
        steps: timed steps per candidate, after one warm-up step; the candidate's
            examples/s is its batch over the fastest step time.
        memory_budget_mb: the memory a probe may use, in MiB. Default on a CPU: half the
            available host memory (RSS growth over the start of the search); on a GPU:
            the device memory (and no prediction: out-of-memory is caught instead).
        knee: `best_batch_size` is the smallest batch within this fraction of the highest
            examples/s.
        effective_batch_size: a global batch to train with even if it does not fit; the
            report's `accumulate_steps` is then the fewest batches to accumulate (see
            `Trainer(accumulate_steps=...)`) so that each fits.
        noise_scale: estimate the gradient noise scale B_simple (`gradient_noise_scale`,
            after a warm-up: see `noise_warmup`) and keep `best_batch_size` at or below
            it: past B_simple a larger batch spends examples without saving steps. Within
            the limits, the batch is then the smallest whose predicted time to a loss,
            (1 + B / B_simple) / examples/s, is within `knee` of the least. Both rules
            take the largest B_simple the estimate supports (`noise.upper_limit`: two
            standard errors up); an estimate too noisy to tell (relative standard error
            from `noise.MAX_ERROR` on) is reported but applies neither. On by default;
            it continues from the last probe's model. Under a time limit its predicted
            cost is reserved: no candidate is started that would eat into it. It is
            skipped (the report's `noise_scale_note` says so) when its cost does not
            fit even so (e.g. the first candidate took the whole limit).
        noise_warmup: examples to train the model on (at the throughput knee, the
            optimizer as given) before estimating the noise scale, which grows as the
            loss falls. None: one pass over the data (at most 50,000 examples), or what
            the time limit leaves; 0: at the probes' model's weights (`steps` + 1 steps a
            candidate from the initial weights). Not measured when no batch above the
            first was faster: it only stops an increase.
        min_steps_per_epoch: `best_batch_size` leaves at least this many optimizer steps
            per epoch when the data's examples are known (a batch of the whole data
            trains one step an epoch, however fast); 1 turns the rule off.
        confirm: settle the knee by interleaved readings before choosing: the first
            candidate, the single readings' knee and the fastest others read again in
            rounds until a 95 % interval decides (`knee` as its tolerance; each row's
            examples/s becomes the mean of its readings), within the time limit; what
            the intervals cannot tell apart keeps the smaller batch ("no measurable
            difference", the report's `compared`).
        clock: the timing source for the timed steps (seconds; inject a fake one in tests).

    Raises:
        ValueError: `start` < 1, `granularity` < 1, `steps` < 1, `limit` < `start`, an
            unknown `mode`, `knee` outside [0, 1), an `effective_batch_size` < 1, a
            `noise_warmup` < 0, or a `memory_budget_mb` <= 0.
    """

    start: int = 8
    limit: int | None = None
    mode: str = "binsearch"
    granularity: int = 8
    steps: int = 5
    memory_budget_mb: float | None = None
    knee: float = 0.05
    effective_batch_size: int | None = None
    noise_scale: bool = True
    noise_warmup: int | None = None
    min_steps_per_epoch: int = 20
    confirm: bool = True
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        for name in ("start", "granularity", "steps", "min_steps_per_epoch"):
            check_int(name, getattr(self, name), 1)
        if self.noise_warmup is not None:
            check_int("noise_warmup", self.noise_warmup, 0)
        if self.limit is not None:
            check_int("limit", self.limit, 1)
            if self.limit < self.start:
                raise ValueError(
                    f"limit ({self.limit}) is smaller than start ({self.start}): no candidate "
                    "to try. Lower start or raise limit (or pass limit=None)."
                )
        if self.mode not in MODES:
            raise ValueError(f"Unknown mode {self.mode!r}. Expected one of {MODES}.")
        knee = self.knee
        if isinstance(knee, bool) or not isinstance(knee, (int, float)) or not 0 <= knee < 1:
            raise ValueError(f"knee must be a fraction in [0, 1), e.g. 0.05 for 5 %; got {knee!r}.")
        if self.effective_batch_size is not None:
            check_int("effective_batch_size", self.effective_batch_size, 1)
        memory = self.memory_budget_mb
        if memory is not None and not memory > 0:
            raise ValueError(f"memory_budget_mb must be > 0 MiB, got {memory!r}.")
