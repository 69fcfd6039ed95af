"""Throughput: examples/s and steps/s over a moving window, after a warm-up; and MFU."""

from __future__ import annotations

import collections
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfaccel.callbacks import _mfu
from tfaccel.callbacks._steps import (
    StepClock,
    params_get,
    positive_int,
    to_float,
    user_stacklevel,
    wait_for,
)


def _loss_count(model) -> float | None:
    """Examples the model's loss tracker (a `Mean` named "loss") has counted, if any."""
    for metric in getattr(model, "metrics", None) or []:
        if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
            return to_float(metric.count)
    return None


def _static_batch_size(model) -> int | None:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if inputs and inputs[0].shape and inputs[0].shape[0]:
        return int(inputs[0].shape[0])
    return None


class Throughput(keras.callbacks.Callback):
    """Examples/s and steps/s over a moving window of steps, after a warm-up.

    Adds `examples_per_second` and `steps_per_second` (the last `window` steps of the
    epoch) to the `on_epoch_end` logs, and at the end of training stores and prints a
    summary: median, p10 and p90 of the per-call rates after warm-up. Time is measured
    between consecutive batch ends, so it includes input wait and Python; calls that
    start inside the first `warmup_steps` steps (tracing, autotuning) are left out.

    Runs too short for the warm-up (e.g. the Trainer, which calls the batch hooks once
    per loop of many steps) are measured with what they have: all of the epoch's calls,
    warm-up included (said once when `verbose`; `summary["includes_warmup"]`). An epoch
    with no finished call gets no throughput keys (never NaN), with one warning.

    Examples per call, in order of preference: `batch_size` × steps; the
    `batch_size` in `params` (custom trainers) × steps; the examples counted by
    the model's loss tracker (exact in `model.fit`, partial batches included);
    the model's static input batch dimension × steps; `logs["size"]` × steps.

    MFU (model FLOPs utilisation), the figure Lightning's `ThroughputMonitor` and
    Composer's `SpeedMonitor` report: the model's training FLOPs per example (3 × its
    forward pass, counted from the graph by TensorFlow's profiler, or given) ×
    examples/s ÷ the machine's peak FLOP/s. The peak here is *measured* (chained matmuls
    in the model's compute dtype, `tfaccel.doctor.MatmulPeak`, about a second at the
    start of training), not a vendor's datasheet figure as theirs, so the same run reads
    higher here. Logged as `mfu` (a fraction) in the epoch logs (a
    `keras.callbacks.TensorBoard` after this callback writes it as `epoch_mfu`), as a
    `tf.summary` scalar "mfu" when a default summary writer is set, and in `summary`.

    Args:
        batch_size: global examples per step, or None to infer it.
        warmup_steps: steps to leave out at the start of training.
        window: steps in the moving window behind the epoch value.
        verbose: print the summary at the end of training.
        mfu: "auto" (on a GPU, or when `peak_flops` is given), True or False.
        flops_per_example: training FLOPs of one example; None counts them.
        peak_flops: the machine's peak FLOP/s; None measures it.

    Raises:
        ValueError: non-positive `batch_size`, `window`, `flops_per_example` or
            `peak_flops`, negative `warmup_steps`, `mfu` not "auto", True or False.
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def __init__(
        self,
        batch_size: int | None = None,
        warmup_steps: int = 5,
        window: int = 50,
        verbose: int | bool = 1,
        *,
        mfu: str | bool = "auto",
        flops_per_example: float | None = None,
        peak_flops: float | None = None,
    ) -> None:
        super().__init__()
        if mfu not in ("auto", True, False):
            raise ValueError(f"mfu must be 'auto', True or False, got {mfu!r}.")
        for name, value in (("flops_per_example", flops_per_example), ("peak_flops", peak_flops)):
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ValueError(f"{name} must be a positive number (or None), got {value!r}.")
        self.mfu, self.flops_per_example, self.peak_flops = mfu, flops_per_example, peak_flops
        self._peaks: dict = {}
        self.batch_size = positive_int("batch_size", batch_size, allow_none=True)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}.")
        self.warmup_steps = warmup_steps
        self.window = positive_int("window", window)
        self.verbose = verbose
        self.summary: dict = {}

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._clock = StepClock()
        self._rates: list[tuple[float, float | None]] = []
        self._examples_total = 0.0
        self._examples_known = True
        self._measured = [0, 0.0, 0.0]  # steps, examples, seconds after warm-up
        self._measured_all = [0, 0.0, 0.0]  # the same, warm-up included
        self._source: str | None = None
        self._warned: set[str] = set()
        self._all_rates: list[tuple[float, float | None]] = []  # warm-up included
        self._flops: float | None = None
        self._peak: float | None = None
        self._start_mfu()
        self.on_epoch_begin(None)  # trainers that never call on_epoch_begin

    def _start_mfu(self) -> None:
        """The FLOPs per example and the peak, when MFU is asked for (see the class)."""
        on = self.mfu is True or (
            self.mfu == "auto"
            and (self.peak_flops is not None or bool(tf.config.list_logical_devices("GPU")))
        )
        if not on or self.model is None:
            return
        self._flops = self.flops_per_example or _mfu.flops_per_example(self.model)
        self._uncounted = [] if self.flops_per_example else _mfu.python_ops(self.model)
        if self._uncounted:
            self.summary["flops_leave_out"] = list(self._uncounted)
        if self._flops is None:
            self._warn_once(
                "flops",
                "Throughput: MFU is not reported: the model's FLOPs per example could not "
                "be counted (no static input shape?). Pass Throughput(flops_per_example=...).",
            )
            return
        self._peak, dtype = (
            (self.peak_flops, None) if self.peak_flops else _mfu.measured_peak(self.model)
        )
        self.summary["peak_flops"] = self._peak
        self.summary["peak_dtype"] = dtype
        self.summary["flops_per_example"] = self._flops

    def _mfu_of(self, examples_per_second: float) -> float | None:
        if self._flops is None or not self._peak:
            return None
        return self._flops * examples_per_second / self._peak

    def on_epoch_begin(self, epoch: int | None, logs: dict | None = None) -> None:
        self._clock.start_epoch()
        self._recent: collections.deque[tuple[int, float | None, float]] = collections.deque()
        self._epoch_calls: list[tuple[int, float | None, float]] = []  # warm-up included
        self._last_time: float | None = None
        self._counted: float | None = None

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._last_time is None:
            self._counted = _loss_count(self.model) if self.model is not None else None
            self._last_time = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        wait_for(logs)
        now = time.perf_counter()
        before = self._clock.steps
        steps = self._clock.advance(batch, logs, self.params)
        examples = self._examples(steps, logs)
        seconds = now - self._last_time if self._last_time is not None else 0.0
        self._last_time = now
        if examples is None:
            self._examples_known = False
        else:
            self._examples_total += examples
        if seconds <= 0:
            return
        self._epoch_calls.append((steps, examples, seconds))
        rate = (steps / seconds, None if examples is None else examples / seconds)
        self._all_rates.append(rate)
        _accumulate(self._measured_all, steps, examples, seconds)
        if before < self.warmup_steps:
            return
        self._recent.append((steps, examples, seconds))
        while sum(s for s, _, _ in self._recent) - self._recent[0][0] >= self.window:
            self._recent.popleft()
        self._rates.append(rate)
        _accumulate(self._measured, steps, examples, seconds)

    def _examples(self, steps: int, logs: dict | None) -> float | None:
        if self.batch_size is not None:
            self._source = "argument"
            return float(self.batch_size * steps)
        params_batch = params_get(self, "batch_size")
        if params_batch:
            self._source = "params"
            return float(params_batch * steps)
        counted = _loss_count(self.model) if self.model is not None else None
        if counted is not None and self._counted is not None:
            delta = counted - self._counted if counted >= self._counted else counted
            self._counted = counted
            if delta > 0:
                self._source = "loss tracker"
                return delta
        static = _static_batch_size(self.model) if self.model is not None else None
        if static:
            self._source = "model input shape"
            return float(static * steps)
        if logs and logs.get("size"):
            self._source = "logs['size']"
            return float(logs["size"]) * steps
        if self._examples_known:
            warnings.warn(
                "Throughput cannot tell the batch size (not given, not in params, no loss "
                "tracker counts, no static input shape, no logs['size']); it reports "
                "steps_per_second only. Pass Throughput(batch_size=...).",
                stacklevel=3,
            )
        return None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None:
            return
        calls = list(self._recent)
        if not calls and self._epoch_calls:
            if self.verbose and "short" not in self._warned:
                self._warned.add("short")
                print(
                    f"Throughput: epoch {epoch} ended within the first {self.warmup_steps} "
                    "warm-up steps; its rate includes warm-up (tracing) time."
                )
            calls = self._epoch_calls
        if not calls:
            self._warn_once(
                "empty",
                f"Throughput: no training call finished in epoch {epoch}; no rate is logged.",
            )
            return
        steps = sum(s for s, _, _ in calls)
        seconds = sum(t for _, _, t in calls)
        logs["steps_per_second"] = steps / seconds
        if self._examples_known:
            logs["examples_per_second"] = sum(e for _, e, _ in calls if e is not None) / seconds
            mfu = self._mfu_of(logs["examples_per_second"])
            if mfu is not None:
                logs["mfu"] = mfu
                tf.summary.scalar("mfu", mfu, step=int(epoch))  # a no-op without a writer

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=user_stacklevel())

    def on_train_end(self, logs: dict | None = None) -> None:
        rates, (steps, examples, seconds) = self._rates, self._measured
        warm = bool(rates)
        if not warm:  # too short for the warm-up: summarise every call instead
            rates, (steps, examples, seconds) = self._all_rates, self._measured_all
        self.summary = {
            **{
                k: v
                for k, v in self.summary.items()
                if k in ("peak_flops", "peak_dtype", "flops_leave_out")
            },
            **({"flops_per_example": self._flops} if self._flops else {}),
            "total_steps": self._clock.steps,
            "total_examples": self._examples_total if self._examples_known else None,
            "batch_size_source": self._source,
            "measured_steps": steps,
            "measured_seconds": seconds,
            "includes_warmup": not warm,
            "steps_per_second": _stats([r for r, _ in rates], steps, seconds),
        }
        mfu = ""
        if self._examples_known:
            per_call = [e for _, e in rates if e is not None]  # all known here
            self.summary["examples_per_second"] = _stats(per_call, examples, seconds)
            value = self._mfu_of(self.summary["examples_per_second"]["overall"])
            if value is not None and np.isfinite(value):
                self.summary["mfu"] = value
                mfu = f"; MFU {value:.1%} of the measured peak"
                if getattr(self, "_uncounted", None):
                    mfu += (
                        " (FLOPs counted from the graph leave out the work inside "
                        f"numpy_function/py_function: {', '.join(self._uncounted)}; pass "
                        "Throughput(flops_per_example=...) to count it)"
                    )
        if self.verbose and rates:
            key = "examples_per_second" if self._examples_known else "steps_per_second"
            unit = "examples/s" if self._examples_known else "steps/s"
            s = self.summary[key]
            after = f"after {self.warmup_steps} warm-up" if warm else "(warm-up included)"
            print(
                f"Throughput: {s['median']:.1f} {unit} median (p10 {s['p10']:.1f}, "
                f"p90 {s['p90']:.1f}) over {steps} steps {after}{mfu}"
            )


def _accumulate(totals: list, steps: int, examples: float | None, seconds: float) -> None:
    totals[0] += steps
    totals[1] += examples or 0.0
    totals[2] += seconds


def _stats(rates: list[float], amount: float, seconds: float) -> dict:
    if not rates:
        nan = float("nan")
        return {"median": nan, "p10": nan, "p90": nan, "overall": nan}
    p10, median, p90 = np.percentile(rates, [10, 50, 90])
    return {
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "overall": amount / seconds if seconds else float("nan"),
    }
