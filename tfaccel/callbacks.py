"""Drop-in Keras callbacks that show where training time and memory go.

Every callback here uses only the Keras callback API (`set_model`, `set_params`
and the `on_*` hooks with `logs` dicts), so the same object works in
`model.fit` and in any custom trainer that calls the standard hooks.

Step counting: Keras 3 calls `on_train_batch_end` once per execution with the
index of the *last* step in it (`steps_per_execution > 1`), so the callbacks
derive the steps since the previous call from the batch index. A custom trainer
that runs several steps per call may instead pass them explicitly as
`logs["steps"]` (or `logs["num_steps"]`); that wins over the index.

Ordering: epoch-level values are added to the `logs` of `on_epoch_end`. Keras
passes one dict through the callbacks in list order, so these callbacks must come
*before* `keras.callbacks.TensorBoard` / `CSVLogger` in the list (History and the
progress bar are appended last by Keras). `ordered(callbacks)` moves them first.

Example:
    >>> from tfaccel import callbacks as cb
    >>> model.fit(ds, epochs=3, callbacks=cb.ordered(           # doctest: +SKIP
    ...     [keras.callbacks.TensorBoard("runs/x"), cb.Throughput(), cb.DeviceMemory()]))
"""

from __future__ import annotations

import collections
import glob
import os
import time
import warnings

import keras
import numpy as np
import psutil
import tensorflow as tf

_MB = 1024.0 * 1024.0


def _positive_int(name: str, value, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def _params_get(callback: keras.callbacks.Callback, key: str):
    return (callback.params or {}).get(key)


def _to_float(value) -> float:
    return float(value.numpy() if hasattr(value, "numpy") else value)


def _wait_for(logs: dict | None) -> None:
    """Blocks until a tensor in `logs` is computed (model.fit already passes floats)."""
    for value in (logs or {}).values():
        if hasattr(value, "numpy"):
            value.numpy()
            return


class _StepClock:
    """Counts training steps across `on_train_batch_end` calls."""

    def __init__(self):
        self.steps = 0
        self._last_batch = -1

    def start_epoch(self) -> None:
        self._last_batch = -1

    def advance(self, batch: int, logs: dict | None, params: dict | None) -> int:
        """Returns the steps run since the previous call and adds them to `steps`."""
        explicit = None
        for key in ("steps", "num_steps"):
            if logs and logs.get(key) is not None:
                explicit = logs[key]
                break
        if explicit is not None:
            if isinstance(explicit, bool) or float(explicit) != int(explicit) or explicit < 1:
                raise ValueError(
                    f"logs['steps'] must be a positive integer (the steps run since the "
                    f"previous on_train_batch_end), got {explicit!r}."
                )
            count = int(explicit)
            self._last_batch = int(batch)
        else:
            last = int(batch)
            per_epoch = (params or {}).get("steps")
            if per_epoch:
                last = min(last, int(per_epoch) - 1)  # a final partial execution
            count = max(last - self._last_batch, 1)
            self._last_batch = last
        self.steps += count
        return count


def _loss_count(model) -> float | None:
    """Examples the model's loss tracker (a `Mean` named "loss") has counted, if any."""
    for metric in getattr(model, "metrics", None) or []:
        if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
            return _to_float(metric.count)
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

    Adds `examples_per_sec` and `steps_per_sec` (the last `window` steps of the
    epoch; NaN while still warming up) to the `on_epoch_end` logs, and at the end
    of training stores and prints a summary: median, p10 and p90 of the per-call
    rates after warm-up. Time is measured between consecutive batch ends, so it
    includes input wait and Python; calls that start inside the first
    `warmup_steps` steps (tracing, autotuning) are left out.

    Examples per call, in order of preference: `batch_size` × steps; the
    `batch_size` in `params` (custom trainers) × steps; the examples counted by
    the model's loss tracker (exact in `model.fit`, partial batches included);
    the model's static input batch dimension × steps; `logs["size"]` × steps.

    Args:
        batch_size: global examples per step, or None to infer it.
        warmup_steps: steps to leave out at the start of training.
        window: steps in the moving window behind the epoch value.
        verbose: print the summary at the end of training.

    Raises:
        ValueError: non-positive `batch_size` or `window`, negative `warmup_steps`.
    """

    def __init__(self, batch_size=None, warmup_steps: int = 5, window: int = 50, verbose=1):
        super().__init__()
        self.batch_size = _positive_int("batch_size", batch_size, allow_none=True)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}.")
        self.warmup_steps = warmup_steps
        self.window = _positive_int("window", window)
        self.verbose = verbose
        self.summary: dict = {}

    def on_train_begin(self, logs=None):
        self._clock = _StepClock()
        self._rates: list[tuple[float, float | None]] = []
        self._examples_total = 0.0
        self._examples_known = True
        self._measured = [0, 0.0, 0.0]  # steps, examples, seconds after warm-up
        self._source = None
        self.on_epoch_begin(None)  # trainers that never call on_epoch_begin

    def on_epoch_begin(self, epoch, logs=None):
        self._clock.start_epoch()
        self._recent = collections.deque()
        self._last_time = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._last_time is None:
            self._counted = _loss_count(self.model) if self.model is not None else None
            self._last_time = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        _wait_for(logs)
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
        if before < self.warmup_steps or seconds <= 0:
            return
        self._recent.append((steps, examples, seconds))
        while sum(s for s, _, _ in self._recent) - self._recent[0][0] >= self.window:
            self._recent.popleft()
        self._rates.append((steps / seconds, None if examples is None else examples / seconds))
        self._measured[0] += steps
        self._measured[1] += examples or 0.0
        self._measured[2] += seconds

    def _examples(self, steps: int, logs: dict | None) -> float | None:
        if self.batch_size is not None:
            self._source = "argument"
            return float(self.batch_size * steps)
        params_batch = _params_get(self, "batch_size")
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
                "steps_per_sec only. Pass Throughput(batch_size=...).",
                stacklevel=3,
            )
        return None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        steps = sum(s for s, _, _ in self._recent)
        seconds = sum(t for _, _, t in self._recent)
        logs["steps_per_sec"] = steps / seconds if seconds else float("nan")
        if self._examples_known:
            examples = sum(e for _, e, _ in self._recent)
            logs["examples_per_sec"] = examples / seconds if seconds else float("nan")

    def on_train_end(self, logs=None):
        steps, examples, seconds = self._measured
        self.summary = {
            "total_steps": self._clock.steps,
            "total_examples": self._examples_total if self._examples_known else None,
            "batch_size_source": self._source,
            "measured_steps": steps,
            "measured_seconds": seconds,
            "steps_per_sec": _stats([r for r, _ in self._rates], steps, seconds),
        }
        if self._examples_known:
            per_call = [e for _, e in self._rates]
            self.summary["examples_per_sec"] = _stats(per_call, examples, seconds)
        if self.verbose and self._rates:
            key = "examples_per_sec" if self._examples_known else "steps_per_sec"
            unit = key.replace("_per_sec", "/s")
            s = self.summary[key]
            print(
                f"Throughput: {s['median']:.1f} {unit} median (p10 {s['p10']:.1f}, "
                f"p90 {s['p90']:.1f}) over {steps} steps after {self.warmup_steps} warm-up"
            )


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


class DeviceMemory(keras.callbacks.Callback):
    """Current and peak memory per GPU, and host RSS, in the epoch logs.

    Per GPU `i`: `mem_gpu{i}_mb` (current) and `mem_gpu{i}_peak_mb` (peak since
    the epoch began: the peak is reset at each epoch start). Host:
    `mem_host_rss_mb` and `mem_host_rss_peak_mb` (highest sample this epoch). On a
    machine without GPUs only the host keys are reported, with one warning.

    Args:
        devices: "all" logical GPUs, or a list of GPU indices / names ("GPU:1").
        every: also sample every this many batch calls and add the values to those
            batch logs (seen by `TensorBoard(update_freq=...)`); None: epochs only.

    Raises:
        ValueError: a non-positive `every`, malformed `devices`, or (at the start of
            training) a named GPU that does not exist.
    """

    def __init__(self, devices="all", every: int | None = None):
        super().__init__()
        if devices != "all":
            if isinstance(devices, (str, int)) or not all(
                isinstance(d, (str, int)) and not isinstance(d, bool) for d in devices
            ):
                raise ValueError(
                    f'devices must be "all" or a list of GPU indices or names, got {devices!r}.'
                )
            devices = [self._name(d) for d in devices]
        self.devices = devices
        self.every = _positive_int("every", every, allow_none=True)
        self._process = psutil.Process()
        self._warned = False

    @staticmethod
    def _name(device) -> str:
        if isinstance(device, int):
            return f"GPU:{device}"
        spec = tf.DeviceSpec.from_string(device)
        if (spec.device_type or "").upper() != "GPU":
            raise ValueError(f"DeviceMemory watches GPUs; {device!r} is not a GPU name.")
        return f"GPU:{spec.device_index or 0}"

    def on_train_begin(self, logs=None):
        present = [
            f"GPU:{tf.DeviceSpec.from_string(d.name).device_index}"
            for d in tf.config.list_logical_devices("GPU")
        ]
        if self.devices == "all":
            self._gpus = present
        else:
            missing = [d for d in self.devices if d not in present]
            if missing:
                raise ValueError(
                    f"DeviceMemory(devices=...) names {missing}, but the logical GPUs here "
                    f'are {present or "none"}. Use devices="all" or an existing index.'
                )
            self._gpus = list(self.devices)
        if not self._gpus and not self._warned:
            self._warned = True
            warnings.warn(
                "DeviceMemory: no GPU is visible, so only host memory (RSS) is reported.",
                stacklevel=2,
            )
        self._calls = 0

    def on_epoch_begin(self, epoch, logs=None):
        for gpu in self._gpus:
            tf.config.experimental.reset_memory_stats(gpu)
        self._host_peak = 0.0
        self._calls = 0

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self.every and self._calls % self.every == 0:
            values = self.sample()
            if logs is not None:
                logs.update(values)

    def on_epoch_end(self, epoch, logs=None):
        values = self.sample()
        if logs is not None:
            logs.update(values)

    def sample(self) -> dict:
        """Returns the current memory values (MiB) under their log keys."""
        values = {}
        for gpu in self._gpus:
            info = tf.config.experimental.get_memory_info(gpu)
            index = gpu.split(":")[1]
            values[f"mem_gpu{index}_mb"] = info["current"] / _MB
            values[f"mem_gpu{index}_peak_mb"] = info["peak"] / _MB
        rss = self._process.memory_info().rss / _MB
        self._host_peak = max(getattr(self, "_host_peak", 0.0), rss)
        values["mem_host_rss_mb"] = rss
        values["mem_host_rss_peak_mb"] = self._host_peak
        return values


class ProfileSteps(keras.callbacks.Callback):
    """Records one TensorBoard profiler trace over a window of training steps.

    Steps count from 0 over the whole training run. The profiler starts at the
    first batch call that begins at or after `start_step` and stops at the first
    call that ends at or after `stop_step`; with `steps_per_execution > 1` the
    window snaps to execution boundaries. The trace lands in
    `logdir/plugins/profile/<run>/` (open with TensorBoard's Profile tab); its
    path is kept in `trace_dir`.

    Args:
        logdir: directory for the trace (the TensorBoard log directory).
        start_step: first step to record (>= 0).
        stop_step: step at which recording stops (> start_step).

    Raises:
        ValueError: empty `logdir`, negative `start_step`, `stop_step <= start_step`.
    """

    def __init__(self, logdir, start_step: int, stop_step: int):
        super().__init__()
        if not logdir or not isinstance(logdir, (str, os.PathLike)):
            raise ValueError(f"logdir must be a non-empty path, got {logdir!r}.")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an integer >= 0, got {start_step!r}.")
        if isinstance(stop_step, bool) or not isinstance(stop_step, int):
            raise ValueError(f"stop_step must be an integer, got {stop_step!r}.")
        if stop_step <= start_step:
            raise ValueError(
                f"stop_step ({stop_step}) must be greater than start_step ({start_step}): "
                "the window [start_step, stop_step) would be empty."
            )
        self.logdir = os.fspath(logdir)
        self.start_step = start_step
        self.stop_step = stop_step
        self.trace_dir = None
        self._clock = _StepClock()
        self._state = "waiting"  # -> "recording" -> "done"

    def on_epoch_begin(self, epoch, logs=None):
        self._clock.start_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        if self._state == "waiting" and self._clock.steps >= self.start_step:
            try:
                tf.profiler.experimental.start(self.logdir)
            except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as error:
                self._state = "done"
                warnings.warn(
                    f"ProfileSteps could not start the profiler ({error}); another profiler "
                    "is running (e.g. TensorBoard(profile_batch=...)). No trace recorded.",
                    stacklevel=2,
                )
                return
            self._state = "recording"

    def on_train_batch_end(self, batch, logs=None):
        self._clock.advance(batch, logs, self.params)
        if self._state == "recording" and self._clock.steps >= self.stop_step:
            _wait_for(logs)
            self._stop()

    def on_train_end(self, logs=None):
        if self._state == "recording":
            self._stop()

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._state = "done"
        runs = glob.glob(os.path.join(self.logdir, "plugins", "profile", "*"))
        self.trace_dir = max(runs, key=os.path.getmtime) if runs else None


def _innermost(optimizer):
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


class LinearScalingWarmup(keras.callbacks.Callback):
    """The linear scaling rule with gradual warm-up (Goyal et al., 2017), per step.

    The learning rate at global step `s` is `base_lr + (target - base_lr) * s / W`
    for `s < W`, where `target = base_lr * batch_size / base_batch_size` and
    `W = round(warmup_epochs * steps_per_epoch)`; from step `W` on it is `target`,
    set once and then left alone (so e.g. `ReduceLROnPlateau` can take over). With
    `steps_per_execution > 1` it changes once per execution. The value at each
    epoch end is added to the logs as `learning_rate`.

    The optimizer must hold its learning rate in a variable (a float
    `learning_rate`); a `LearningRateSchedule` cannot be set from outside.

    Args:
        base_lr: learning rate that works at `base_batch_size`.
        base_batch_size: batch size `base_lr` was tuned for.
        batch_size: global batch size used now.
        warmup_epochs: epochs (may be fractional) to ramp from `base_lr` to target.
        steps_per_epoch: steps per epoch; default `params["steps"]` from `fit`.

    Raises:
        ValueError: non-positive numbers, negative `warmup_epochs`, or (at the start
            of training) unknown steps per epoch.
        TypeError: (at the start of training) an optimizer whose learning rate is a
            schedule or callable.
    """

    def __init__(
        self,
        base_lr: float,
        base_batch_size: int,
        batch_size: int,
        warmup_epochs: float = 5,
        steps_per_epoch: int | None = None,
    ):
        super().__init__()
        if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) or base_lr <= 0:
            raise ValueError(f"base_lr must be a positive number, got {base_lr!r}.")
        self.base_batch_size = _positive_int("base_batch_size", base_batch_size)
        self.batch_size = _positive_int("batch_size", batch_size)
        if (
            isinstance(warmup_epochs, bool)
            or not isinstance(warmup_epochs, (int, float))
            or warmup_epochs < 0
        ):
            raise ValueError(f"warmup_epochs must be a number >= 0, got {warmup_epochs!r}.")
        self.steps_per_epoch = _positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
        self.base_lr = float(base_lr)
        self.warmup_epochs = warmup_epochs
        self.target_lr = self.base_lr * self.batch_size / self.base_batch_size

    def lr_at(self, step: int) -> float:
        """Returns the learning rate for global step `step` (needs steps per epoch)."""
        if step >= self._warmup_steps:
            return self.target_lr
        return self.base_lr + (self.target_lr - self.base_lr) * step / self._warmup_steps

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise RuntimeError(
                "LinearScalingWarmup needs a compiled model with an optimizer; call "
                "model.compile(optimizer=...) first."
            )
        inner = _innermost(optimizer)
        if not isinstance(getattr(inner, "_learning_rate", None), keras.Variable):
            raise TypeError(
                f"LinearScalingWarmup cannot set the learning rate of {type(inner).__name__}: "
                "it was created with a LearningRateSchedule (or callable), which is not "
                "settable. Either pass a float learning_rate to the optimizer (the warm-up then "
                "ends at the scaled rate and stays there), or fold the warm-up into your "
                "schedule (e.g. keras.optimizers.schedules.CosineDecay(warmup_steps=..., "
                "warmup_target=...)) and drop this callback."
            )
        per_epoch = self.steps_per_epoch or _params_get(self, "steps")
        if not per_epoch:
            raise ValueError(
                "LinearScalingWarmup needs the number of steps per epoch, but params has no "
                "'steps' (a dataset of unknown length?). Pass steps_per_epoch=... to the "
                "callback (or to fit)."
            )
        self._per_epoch = int(per_epoch)
        self._warmup_steps = max(round(self.warmup_epochs * self._per_epoch), 0)
        self._optimizer = optimizer
        self._clock = _StepClock()
        self._started = False
        self._handed_over = False

    def on_epoch_begin(self, epoch, logs=None):
        if not self._started:  # resume from initial_epoch
            self._started = True
            self._clock.steps = int(epoch) * self._per_epoch
        self._clock.start_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        step = self._clock.steps
        if step < self._warmup_steps:
            self._optimizer.learning_rate = self.lr_at(step)
        elif not self._handed_over:
            self._optimizer.learning_rate = self.target_lr
            self._handed_over = True

    def on_train_batch_end(self, batch, logs=None):
        self._started = True
        self._clock.advance(batch, logs, self.params)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _to_float(self._optimizer.learning_rate)


class HostGap(keras.callbacks.Callback):
    """Fraction of each epoch's training time spent between batch calls.

    The gap is the time from one `on_train_batch_end` to the next
    `on_train_batch_begin`: Python, callbacks, and input fetched on the host. The
    epoch value (`host_gap_fraction` in the logs) is the summed gaps over the time
    from the first batch begin to the last batch end; above `threshold` it warns
    once per training run. Note: `model.fit` on TensorFlow pulls `tf.data` batches
    *inside* its train function, so there a slow pipeline shows as slow steps,
    not as a gap; the gap catches host-side loops and slow callbacks.

    Args:
        threshold: warn when an epoch's fraction exceeds this (0 < threshold < 1).

    Raises:
        ValueError: a threshold outside (0, 1).
    """

    def __init__(self, threshold: float = 0.2):
        super().__init__()
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"threshold must be a number in (0, 1), got {threshold!r}.")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold!r}.")
        self.threshold = float(threshold)
        self.fractions: list[float] = []

    def on_train_begin(self, logs=None):
        self.fractions = []
        self._warned = False
        self.on_epoch_begin(None)

    def on_epoch_begin(self, epoch, logs=None):
        self._first = self._last_end = None
        self._gap = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        if self._last_end is not None:
            self._gap += now - self._last_end

    def on_train_batch_end(self, batch, logs=None):
        _wait_for(logs)
        self._last_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self._first is None or self._last_end is None:
            return
        total = self._last_end - self._first
        fraction = self._gap / total if total > 0 else 0.0
        self.fractions.append(fraction)
        if logs is not None:
            logs["host_gap_fraction"] = fraction
        if fraction > self.threshold and not self._warned:
            self._warned = True
            warnings.warn(
                f"HostGap: {fraction:.0%} of epoch {epoch}'s training time was spent between "
                f"steps (threshold {self.threshold:.0%}): the job waits on the host (input "
                "fetched in Python, slow callbacks). Move input into tf.data with prefetch, "
                "or run more steps per call (steps_per_execution).",
                stacklevel=2,
            )


_PRODUCERS = (Throughput, DeviceMemory, ProfileSteps, LinearScalingWarmup, HostGap)


def ordered(callbacks) -> list:
    """Returns `callbacks` with tfaccel's callbacks moved first (stable order otherwise).

    Their epoch values then reach `TensorBoard`, `CSVLogger` and any other callback
    that reads the logs.
    """
    callbacks = list(callbacks or [])
    ours = [c for c in callbacks if isinstance(c, _PRODUCERS)]
    return ours + [c for c in callbacks if not isinstance(c, _PRODUCERS)]
