"""The doctor's measurement, one phase a function: the warm-up, compute alone, the real
step back to back, and the input alone. `diagnose` runs them in order on a shared
`Probe` and turns their seconds into `verdict.Measured`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import tensorflow as tf

from tfaccel.callbacks import peak
from tfaccel.choices import loop_size
from tfaccel.data.assembly.feed import Feed
from tfaccel.data.iterators import adopt
from tfaccel.doctor import machine, measure

if TYPE_CHECKING:
    from tfaccel.train.step.runner_interface import RunnerInterface

T = TypeVar("T")

MIN_WINDOW_S, MAX_WINDOW_S = 0.05, 1.0  # each timed measurement, per round

# Shares of the time left after the warm-up: compute alone (in rounds), the real step
# (back to back), the input alone (a fresh iterator, back to back), the input fixes.
SHARES = {"compute": 0.3, "real": 0.3, "input": 0.2, "fixes": 0.2}
WINDOWS = 4  # back-to-back windows of the real step and of the input alone


class Job(Protocol):
    """What the phases read of `diagnose`'s job: the runner and the loop size it chose."""

    @property
    def runner(self) -> RunnerInterface: ...

    @property
    def chosen(self) -> int | None: ...


@dataclasses.dataclass
class Probe:
    """What the measurement's steps share: the job, its iterators and the warm-up's times."""

    job: Job  # diagnose._Job: the runner, its loop size setting, the Trainer if any
    feed: Feed
    gpus: list[str]
    real: Any  # the real pipeline's endless distributed iterator
    cached: Any  # one cached batch, endless: compute alone
    t1: float  # one step on the cached batch
    real1: float  # the first real step (pays the pipeline's start-up)
    real_next: float  # a real step's own cost
    second_wait: float | None  # the second real step's wait for input
    left: float = 0.0  # seconds of the budget left after the warm-up
    unmeasured: list[str] = dataclasses.field(default_factory=list)

    @property
    def runner(self) -> RunnerInterface:
        """The job's runner (the Trainer's step loops, or one made for a compiled model)."""
        return self.job.runner

    @property
    def strategy(self) -> tf.distribute.Strategy:
        """The strategy the runner's data is distributed with."""
        return self.job.runner.strategy


def warm_up(job: Job, feed: Feed) -> Probe:
    """Traces on the cached batch (the real iterator shares the trace), then starts the
    real pipeline with two timed real steps: the first pays its start-up (a shuffle buffer
    to fill, files to open), which an epoch pays once; the second is a step's own cost."""
    runner = job.runner
    gpus = machine.gpus(runner.strategy)
    for gpu in gpus:
        tf.config.experimental.reset_memory_stats(gpu)
    real = adopt(iter(feed.repeated().distribute(endless=True)))
    cached = adopt(iter(feed.one_batch().distribute(endless=True)))
    runner.train(cached, 1)
    t1 = min(measure.train_calls(runner, cached, 1, 2)[0])
    real1 = measure.train_calls(runner, real, 1, 1)[0][0]
    second_times, second_results = measure.train_calls(runner, real, 1, 1)
    return Probe(
        job, feed, gpus, real, cached, t1, real1, min(second_times[0], real1),
        second_results[0].input_wait_s,
    )  # fmt: skip


@dataclasses.dataclass
class Compute:
    step_s: float
    overhead_s: float
    long_n: int
    all_reduce_s: float | None
    matmul: peak.MatmulPeak | None  # on a CPU, else None
    busy: measure.CoresBusy  # of the long calls


def compute_alone(p: Probe, rounds: int) -> Compute:
    """Compute alone on the cached batch, in alternating rounds (the fastest call of each
    size counts): one-step and long calls, with and without the all-reduce, the peak."""
    runner, strategy, t1 = p.runner, p.strategy, p.t1
    comm = strategy.num_replicas_in_sync > 1
    pieces = (3 if comm else 2) + (0 if p.gpus else 1)  # + a matmul peak call on a CPU
    window = p.left * SHARES["compute"] / (rounds * pieces)
    window = measure.agree(strategy, min(max(window, MIN_WINDOW_S), MAX_WINDOW_S))
    long_n = int(measure.agree(strategy, min(max(round(window / 3 / t1), 2), 10_000)))
    grads = measure.GradientLoops(runner.model, runner.loss, strategy) if comm else None
    if grads is not None:
        grads.seconds(True, p.cached, 1, 1)
        grads.seconds(False, p.cached, 1, 1)
    matmul = peak.MatmulPeak(n=1024) if not p.gpus else None
    host1, hostn, with_ar, without_ar = [], [], [], []
    busy = measure.CoresBusy()
    ones = int(measure.agree(strategy, min(max(window / t1, 2), 5)))
    longs = 2 if long_n * t1 > window / 2 else 3
    for _ in range(rounds):
        host1 += measure.train_calls(runner, p.cached, 1, ones)[0]
        with busy:
            hostn += measure.train_calls(runner, p.cached, long_n, longs)[0]
        if grads is not None:
            with_ar += grads.seconds(True, p.cached, long_n, longs)
            without_ar += grads.seconds(False, p.cached, long_n, longs)
        if matmul is not None:
            matmul.measure(1)
    step_s, overhead_s = _fit(host1, hostn, long_n)
    all_reduce = None
    if grads is not None:
        all_reduce = max((min(with_ar) - min(without_ar)) / long_n, 0.0)
    return Compute(step_s, overhead_s, long_n, all_reduce, matmul, busy)


def real_step(
    p: Probe, c: Compute
) -> tuple[float, list[tuple[float, float | None]], list[float], int]:
    """The real step, back to back (the first window drains what the buffers held), at
    the job's steps per call, fewer where a call would overrun a window; as many windows
    as its share of the budget holds (at least one). Returns (the real step's seconds at
    the chosen loop size, the steady windows, their input waits, that loop size)."""
    strategy, job = p.strategy, p.job
    share, per_step = p.left * SHARES["real"], max(p.real_next, p.t1)
    m = max(1, min(job.chosen or c.long_n, c.long_n, int(share / WINDOWS / 2 / per_step)))
    m = int(measure.agree(strategy, m))
    count = int(measure.agree(strategy, min(max(int(share / (m * per_step)), 1), WINDOWS)))
    sub = measure.agree(strategy, max(share / count, MIN_WINDOW_S))
    if share >= m * per_step:
        windows = measure.train_windows(p.runner, p.real, m, sub, count)
    else:  # not one more call fits: the second real step stands for it
        p.unmeasured.append("the real step beyond its second call (a call exceeds its share)")
        windows = [(p.real_next, p.second_wait)]
    steady = windows[1:] or windows
    n = int(measure.agree(strategy, job.chosen or loop_size.choose(c.overhead_s, c.step_s)))
    real_s = statistics.median(w[0] for w in steady) - c.overhead_s / m + c.overhead_s / n
    waits = [w[1] for w in steady if w[1] is not None]
    return real_s, steady, waits, n


def input_alone(
    p: Probe, steady: list[tuple[float, float | None]]
) -> tuple[float | None, list[float], float | None, measure.CoresBusy]:
    """The input alone: a fresh iterator (it pays what an epoch pays to start), read back
    to back through the same distribution layer as the step — where a batch fits in its
    share of the budget (a real step's time bounds a batch's); then the plain dataset
    without the distribution layer. Returns (start-up s, batch reads s, plain read s,
    the reads' CoresBusy)."""
    strategy, k = p.strategy, p.runner.batches_per_step
    share = p.left * SHARES["input"]
    after_startup = share - max(p.real1 - p.real_next, 0.0)
    count = min(max(int(after_startup / max(p.real_next, 1e-6)) - 1, 0), WINDOWS)
    count = int(measure.agree(strategy, count))
    startup_s: float | None = None
    reads_s: list[float] = []
    sub_in, busy = MIN_WINDOW_S, measure.CoresBusy()
    if count:
        sub_in = measure.agree(strategy, max(share / (count + 1), MIN_WINDOW_S))
        reads = adopt(iter(p.feed.repeated().distribute(endless=True)))
        with busy:
            startup_s, reads_s = measure.read_windows(reads, sub_in, count)
    if not reads_s:
        why = "no batch within its window" if count else "a batch takes longer than its share"
        p.unmeasured.append(f"the input alone ({why}; the real step's time stands for it)")
        reads_s = [statistics.median(w[0] for w in steady) / k]
        if p.real1 > 2 * p.real_next:  # what the first real step paid beyond a step
            startup_s = p.real1 - p.real_next
    plain_s = None
    comm = strategy.num_replicas_in_sync > 1
    if not isinstance(strategy, type(tf.distribute.get_strategy())) or comm:
        plain = adopt(iter(p.feed.repeated().dataset))
        plain_s = median_or(measure.read_windows(plain, sub_in / 2, 2)[1], None)
    return startup_s, reads_s, plain_s, busy


def _fit(ones: list[float], longs: list[float], n: int) -> tuple[float, float]:
    """(step, overhead) from the fastest call of 1 step and of n steps: T(n) = o + n·s."""
    t1, tn = min(ones), min(longs)
    step = max((tn - t1) / (n - 1), 1e-9)
    return step, max(t1 - step, 0.0)


def median_or(values: Sequence[float], default: T) -> float | T:
    """The median of `values`, or `default` when there is none."""
    return statistics.median(values) if values else default
