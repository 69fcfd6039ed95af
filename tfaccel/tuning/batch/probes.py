"""The batch-size search's machinery: one search's state (`Search`: the model, its probes,
the time spent), the probe timer, the exploration of candidates (`explore`), and the
argument checks `find_batch_size` shares."""

from __future__ import annotations

import dataclasses
import gc
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.callbacks._steps import wait_for
from tfaccel.choices import readings
from tfaccel.errors import NoBatchSizeFitsError
from tfaccel.tuning.batch import budget, early, inputs, noise_probe
from tfaccel.tuning.batch.budget import TimeLimit
from tfaccel.tuning.batch.memory import MemoryMeter, predict_mb
from tfaccel.tuning.batch.report import ProbeRow, knee_batch_size
from tfaccel.tuning.oom import (
    describe_out_of_memory,
    is_out_of_memory,
    release_memory,
    split_until_fits,
)

logger = logging.getLogger("tfaccel")

CONFIRM_ROUNDS = 3  # the knee and the first candidate: interleaved rounds read at least
CONFIRM_MAX_ROUNDS = 8  # ... and at most, within the time limit
MOST_CONTENDERS = 10  # candidates read again for the knee: the first, the knee, the fastest


def _cost(search: Search, pair: list[tuple[ProbeRow, float]]) -> float:
    """Seconds one round of readings of `pair` takes at their first readings."""
    return sum((search.steps + 1) * r.batch_size / rate for r, rate in pair)


class ProbeTimer(keras.callbacks.Callback):
    """Reads `clock` at the end of every step (after a host sync); samples host memory.

    `step_seconds()` are the durations of the steps after the warm-up step.
    """

    def __init__(self, clock: Callable[[], float], meter: MemoryMeter):
        super().__init__()
        self.clock, self.meter = clock, meter
        self.times: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        wait_for(logs)
        self.times.append(self.clock())
        self.meter.sample()

    def step_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.times[:-1], self.times[1:], strict=True)]


def check_int(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
    return value


def resolve_optimizer(optimizer: Any) -> Callable[[], keras.optimizers.Optimizer]:
    """A fresh optimizer per probe: names and callables as they are, instances cloned."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        config = optimizer.get_config()
        return lambda: type(optimizer).from_config(config)
    if isinstance(optimizer, str):
        return lambda: keras.optimizers.get(optimizer)
    if callable(optimizer):
        return optimizer
    raise TypeError(
        f"optimizer must be a Keras optimizer, its name, or a callable building one; got "
        f"{type(optimizer).__name__}."
    )


class Search:
    def __init__(
        self,
        build_model: Callable[[], keras.Model],
        data: tf.data.Dataset,
        loss: Any,
        optimizer: Any,
        strategy: tf.distribute.Strategy,
        steps: int,
        meter: MemoryMeter,
        budget: float | None,
        clock: Callable[[], float],
        time_limit: TimeLimit,
    ) -> None:
        self.build_model = build_model
        self.data = data
        self.loss = loss
        self.make_optimizer = resolve_optimizer(optimizer)
        self.strategy = strategy
        self.steps = steps
        self.meter = meter
        self.budget = budget
        self.predict = budget is not None
        self.clock = clock
        self.rows: list[ProbeRow] = []
        self.examples = inputs.count_examples(data)  # None: counted when a batch needs it
        self.time_limit = time_limit
        self.noise_asked = False  # set by find_batch_size
        self.noise_warmup: int | None = None  # set by find_batch_size
        self.confirm = True  # set by find_batch_size: the knee and the first timed twice
        self.min_steps_per_epoch: int | None = None  # set by find_batch_size: caps candidates
        # One model for every candidate while they fit (built again after a failure): a
        # candidate costs its steps and, for the first two shapes, a trace — not a build.
        # The noise scale continues from it.
        self.last_model: keras.Model | None = None
        self.declined: str | None = None  # why the first reading stopped the search
        self.compared: str | None = None  # the knee's readings did not decide (confirm_knee)
        self.knee_batch: int | None = None  # the knee the readings kept (confirm_knee)

    @property
    def steps_cap(self) -> int | None:
        """The largest batch leaving `min_steps_per_epoch` steps an epoch (None: no cap)."""
        if self.examples is None or self.min_steps_per_epoch is None:
            return None
        return self.examples // self.min_steps_per_epoch

    def has_examples(self, batch_size: int) -> bool:
        """Whether the data holds at least `batch_size` examples (counting only that many)."""
        if self.examples is None:
            count = int(self.data.take(batch_size).reduce(0, lambda n, _: n + 1))
            if count >= batch_size:
                return True
            self.examples = count
        return batch_size <= self.examples

    def spent(self, batch: int) -> bool:
        """Whether a probe of `batch` would eat into the time limit or the noise scale's reserve."""
        reserve = None
        if self.noise_asked:
            reserve = lambda limit: noise_probe.reserve(self, batch, limit)  # noqa: E731
        return self.time_limit.spent(self.rows, batch, self.steps, reserve)

    def note_declined(self, batch: int) -> None:
        """At the time limit after the first reading alone: says why, and from what job
        size a probe of `batch` fits (`budget.declined`)."""
        if sum(1 for r in self.rows if r.fits and r.examples_per_second) != 1:
            return
        reserve = None
        if self.noise_asked:
            reserve = lambda limit: noise_probe.reserve(self, batch, limit)  # noqa: E731
        self.declined = budget.declined(self.time_limit, self.rows, batch, self.steps, reserve)
        logger.info("find_batch_size: %s", self.declined)

    def read_early(self, batch: int) -> bool:
        """The first candidate's forward pass (`early`): True when the search declines there.

        Only with the job's size, on one replica; the model built stays the probe's. A
        model whose forward pass cannot be traced alone is left to the probe.
        """
        limit = self.time_limit
        if limit.job_examples is None or self.strategy.num_replicas_in_sync != 1:
            return False
        began = time.perf_counter()
        try:
            self.last_model = self._build()
            x = next(iter(self.data.take(batch).batch(batch)))[0]
            reading = early.read_forward(self.last_model, x, batch)
        except Exception as error:  # noqa: BLE001 - optional: the probe's own reading decides
            logger.info("find_batch_size: no forward reading (%s)", error)
            self.last_model = None
            return False
        warmup = None
        if self.noise_asked:  # as `noise_probe`: by default one pass, at most 50,000 examples
            most = noise_probe.WARMUP_EXAMPLES
            warmup = self.noise_warmup
            warmup = min(self.examples or most, most) if warmup is None else warmup
        why = early.project(
            reading, limit.elapsed(), limit.job_examples, self.steps, self.examples, warmup,
            self.confirm,
        )  # fmt: skip
        if why is None:
            return False
        seconds = time.perf_counter() - began
        rate = reading.examples_per_second
        self.rows.append(ProbeRow(batch, True, rate, None, "estimated", seconds=seconds))
        self.rows.append(ProbeRow(2 * batch, False, None, None, "time"))
        self.declined = why
        logger.info("find_batch_size: %s", why)
        return True

    def _fitted(self) -> list[tuple[int, float]]:  # every row that ran to the end was measured
        return [
            (r.batch_size, r.peak_memory_mb)
            for r in self.rows
            if r.fits and r.peak_memory_mb is not None
        ]

    def _build(self) -> keras.Model:
        with self.strategy.scope():
            model = self.build_model()
            if not isinstance(model, keras.Model):
                raise TypeError(
                    f"build_model must return a keras.Model, got {type(model).__name__}. "
                    "Return the model from the function (e.g. `return keras.Sequential(...)`)."
                )
            model.compile(optimizer=self.make_optimizer(), loss=self.loss, jit_compile="auto")
        return model

    def time_steps(self, batch_size: int) -> float | None:
        """Examples/s of the shared model at `batch_size`: one warm-up step, then `steps`.

        The fastest step: a neighbour on a shared host (or a garbage collection) only
        adds time to a step, so the least is the step's own cost — and it stays put
        where the median of a few steps moved with the load (a CPU-bound neighbour:
        `benchmarks/results/batch_finder_noise.json`).
        """
        data = (
            self.data.take(batch_size)
            .cache()
            .repeat()
            .batch(batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        timer = ProbeTimer(self.clock, self.meter)
        assert self.last_model is not None  # probe() builds it before timing
        self.last_model.fit(
            data,
            epochs=1,
            steps_per_epoch=self.steps + 1,
            callbacks=[timer],
            shuffle=False,  # the probe repeats one cached batch; nothing to shuffle
            verbose=0,
        )
        seconds = min(timer.step_seconds())
        return batch_size / seconds if seconds > 0 else None

    def confirm_knee(self, knee: float) -> None:
        """Settles the knee by interleaved readings (`tfaccel.choices.readings.compare`,
        `knee` as its tolerance): the first candidate, the single readings' knee and the
        fastest others (`MOST_CONTENDERS` in all), smallest first, from their first
        readings on for `CONFIRM_ROUNDS` rounds at least, up to `CONFIRM_MAX_ROUNDS`
        until the intervals decide.

        One noisy reading must not decide the batch (on a shared host the search once
        read 32 at 1,000 examples/s, 64 at 4,880 and 160 at 5,211). The knee kept
        (`knee_batch`) is the smallest contender the readings do not show more than
        `knee` slower than the fastest; each contender's examples/s becomes the mean
        of its readings. When the intervals do not decide, `compared` says so ("no
        measurable difference") and the smaller batch, the simpler setting, is kept.
        With the time limit (and the noise scale's reserve) the slowest contenders are
        left out until the least rounds fit; skipped when not even two do.
        """
        timed = [(r, r.examples_per_second) for r in self.rows if r.fits and r.examples_per_second]
        if len(timed) < 2 or self.last_model is None:
            return
        single = knee_batch_size(self.rows, knee)
        fastest = sorted(timed[1:], key=lambda t: -t[1])
        kept = [timed[0], *(t for t in fastest if t[0].batch_size == single)]
        kept += [t for t in fastest if t not in kept][: max(MOST_CONTENDERS - len(kept), 0)]
        pair = sorted(kept, key=lambda t: t[0].batch_size)  # the simplest (smallest) first
        room = self._room(single or pair[-1][0].batch_size)
        while (
            room is not None and len(pair) > 2 and (CONFIRM_ROUNDS - 1) * _cost(self, pair) > room
        ):
            slowest = min(
                pair[1:], key=lambda t: t[1] if t[0].batch_size != single else float("inf")
            )
            pair.remove(slowest)
        cost = _cost(self, pair)
        if room is not None and (CONFIRM_ROUNDS - 1) * cost > room:
            return
        sizes = [r.batch_size for r, _ in pair]
        try:
            found = readings.compare(
                self._reading, sizes, budget_s=None if room is None else room - cost,
                min_rounds=CONFIRM_ROUNDS, max_rounds=CONFIRM_MAX_ROUNDS,
                prior={r.batch_size: [rate] for r, rate in pair}, tolerance=knee,
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - only out-of-memory is caught
            if not is_out_of_memory(error):
                raise
            return  # the first readings stand (a probe that fit once may not again)
        for row, _ in pair:
            taken = [v for v in found.readings[row.batch_size] if v > 0]
            index = self.rows.index(row)
            self.rows[index] = dataclasses.replace(row, examples_per_second=statistics.fmean(taken))
            logger.info("batch %d: read at %s examples/s", row.batch_size, taken)
        self.knee_batch = next(b for b in sizes if b == found.chosen)
        self.compared = None
        if not found.separated:  # the intervals did not decide: the simpler batch is kept
            self.compared = f"batches {', '.join(map(str, sizes))} read again: {found.reason}"

    def _room(self, batch: int) -> float | None:
        """Seconds the time limit leaves the knee's readings (None: no limit)."""
        left = self.time_limit.left(self.rows)
        if left is None:
            return None
        return left - (noise_probe.reserve(self, batch, left) if self.noise_asked else 0.0)

    def _reading(self, batch_size: int) -> float:
        """One more reading of a candidate's examples/s (0.0: none)."""
        return self.time_steps(batch_size) or 0.0

    def probe(self, batch_size: int) -> ProbeRow:
        """Runs one candidate (or predicts it over budget) and records its row."""
        predicted = predict_mb(self._fitted(), batch_size) if self.predict else None
        if predicted is not None and self.budget is not None and predicted > self.budget:
            row = ProbeRow(batch_size, False, None, None, "budget", predicted)
            self.rows.append(row)
            logger.info("batch %d: predicted %.0f MiB > budget, not run", batch_size, predicted)
            return row
        began = time.perf_counter()
        failure = None
        try:
            if self.last_model is None:  # the first candidate, or the one after a failure
                if self.rows or self.meter.on_gpu:  # on a CPU nothing of the search to free yet
                    release_memory()
                self.last_model = self._build()
            self.meter.start()
            rate = self.time_steps(batch_size)
        except Exception as error:  # noqa: BLE001 - only out-of-memory is caught below
            if not is_out_of_memory(error):
                raise
            failure = describe_out_of_memory(error)
            self.last_model = None  # its state after the failure is not trusted: rebuild
            release_memory()
        if failure is not None:
            row = ProbeRow(batch_size, False, None, None, "oom", predicted, failure)
        else:
            peak = self.meter.peak_mb()
            over = self.budget is not None and peak > self.budget
            row = ProbeRow(
                batch_size,
                not over,
                None if over else rate,
                peak,
                "budget" if over else "ok",
                predicted,
                seconds=time.perf_counter() - began,
            )
        logger.info("batch %d: %s", batch_size, row)
        self.rows.append(row)
        return row


def explore(
    search: Search, start: int, limit: int | None, mode: str, step: int, replicas: int
) -> int:
    """Runs the candidates in order; returns the largest batch that fits."""

    def round_up(b: int) -> int:
        return -(-b // replicas) * replicas

    largest: int | None = None
    failed: int | None = None
    capped: int | None = None
    batch = round_up(start)
    while True:
        if limit is not None and batch > limit:
            search.rows.append(ProbeRow(batch, False, None, None, "limit"))
            capped = limit
            break
        if largest is not None and search.spent(batch):
            search.rows.append(ProbeRow(batch, False, None, None, "time"))
            search.note_declined(batch)
            break
        if not search.has_examples(batch):
            assert search.examples is not None  # has_examples counted them
            fewer = search.examples // replicas * replicas
            if largest is None and fewer >= replicas:  # start above the data: start at it
                batch = fewer
                continue
            if largest is None:
                raise ValueError(
                    f"The data holds {search.examples} example(s), fewer than the "
                    f"{replicas} replicas: not one example per replica."
                )
            search.rows.append(ProbeRow(batch, False, None, None, "data"))
            capped = search.examples
            break
        if search.steps_cap is not None and batch > search.steps_cap and largest is not None:
            search.rows.append(ProbeRow(batch, False, None, None, "steps per epoch"))
            capped = search.steps_cap
            break
        if largest is None and not search.rows:
            if search.read_early(batch):
                return batch  # declined at the forward pass: no training step ran
            # The memory readings start clean: garbage freed during a probe would read as
            # less growth; later collections skip everything alive now (TF's own objects).
            gc.collect()
            gc.freeze()
        row = search.probe(batch)
        if not row.fits:
            failed = batch
            break
        largest = batch
        batch = round_up(batch * 2)
    if largest is None:  # the first candidate did not fit: 1/2, 1/4, ... of it (shared retry)
        if (first_failed := failed) is None:  # none ran: the first, rounded, was past limit
            raise TypeError(
                f"No candidate: start rounded to the replicas ({round_up(start)}) > limit={limit}."
            )

        def attempt(k: int) -> bool:
            nonlocal failed
            batch = round_up(first_failed // k)
            fits = search.probe(batch).fits
            failed = failed if fits else batch
            return fits

        k = split_until_fits(attempt, first_failed, replicas=replicas)
        largest = None if k is None else round_up(first_failed // k)
        if largest is None:
            smallest = min(search.rows, key=lambda r: r.batch_size)
            memory = smallest.peak_memory_mb or smallest.predicted_memory_mb or 0.0
            detail = smallest.error or (
                f"its memory ({memory:.0f} MiB) exceeds the budget of {search.budget:.0f} MiB"
            )
            raise NoBatchSizeFitsError(
                f"No batch size fits: the smallest tried, {smallest.batch_size}, failed "
                f"({smallest.reason}): {detail}. Use a smaller model or input, remat "
                "(tfaccel blocks' remat=True), mixed precision, or a larger memory_budget_mb."
            )
    timed_out = search.rows[-1].reason == "time"
    if mode == "binsearch" and not timed_out:
        if failed is not None:
            upper = failed
        else:  # the loop stopped at a cap (limit, data, steps per epoch)
            assert capped is not None
            upper = capped + 1
        largest = _bisect(search, largest, upper, step)
    return largest


def _bisect(search: Search, largest: int, upper: int, step: int) -> int:
    """The largest multiple of `step` that fits between `largest` (fits) and `upper` (does
    not, or the cap + 1), by bisection while the time limit allows."""
    while True:
        first = (largest // step + 1) * step
        candidates = list(range(first, upper, step))
        if not candidates:
            return largest
        middle = candidates[(len(candidates) - 1) // 2]
        if search.spent(middle):
            return largest
        if search.probe(middle).fits:
            largest = middle
        else:
            upper = middle


def strategy_gpus(strategy: tf.distribute.Strategy, gpus: list[str]) -> list[str]:
    """The logical GPUs (as "GPU:i") the strategy computes on; [] on CPU."""
    try:
        names = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: TensorFlow's default device
        return ["GPU:0"] if gpus else []
    found = []
    for name in names:
        lowered = name.lower()
        if "gpu:" in lowered:
            found.append("GPU:" + lowered.rsplit("gpu:", 1)[1])
    return found
