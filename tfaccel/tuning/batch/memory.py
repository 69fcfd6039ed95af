"""Measuring a probe's peak memory and predicting the next one's.

On a GPU the peak is TensorFlow's allocator peak (`get_memory_info`, reset before
each probe). On a CPU there is no catchable out-of-memory — the kernel kills the
process — so the peak is the host's resident set size (psutil; on Linux the kernel's
high-water mark, reset per probe) above the size at the start of the search, and
the search predicts each candidate's memory before running it.
"""

from __future__ import annotations

import pathlib

import psutil
import tensorflow as tf

from tfaccel import devices

MB = 1024.0 * 1024.0
_CLEAR_REFS = pathlib.Path("/proc/self/clear_refs")
_STATUS = pathlib.Path("/proc/self/status")


def _rss_high_water_mb() -> float | None:
    """The kernel's peak RSS of this process (VmHWM) in MiB, or None where unavailable."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_rss_high_water() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class MemoryMeter:
    """Peak memory of one probe, in MiB.

    Args:
        devices: logical GPU names to watch (e.g. ["GPU:0"]); empty → host memory.
    """

    def __init__(self, devices: list[str]):
        self.devices = list(devices)
        self.process = psutil.Process()
        self.baseline_mb = self.process.memory_info().rss / MB
        self._sampled = 0.0
        self._high_water = False

    @property
    def on_gpu(self) -> bool:
        return bool(self.devices)

    def default_budget_mb(self) -> float:
        """GPU: the smallest watched device's memory; CPU: half the available host memory."""
        if self.on_gpu:
            sizes = [_device_memory_mb(name) for name in self.devices]
            known = [s for s in sizes if s]
            if known:
                return float(min(known))
        return psutil.virtual_memory().available / MB / 2.0

    def start(self) -> None:
        if self.on_gpu:
            for name in self.devices:
                tf.config.experimental.reset_memory_stats(name)
            return
        self._sampled = self.process.memory_info().rss / MB
        self._high_water = _reset_rss_high_water()

    def sample(self) -> None:
        """Records the current host RSS (called between steps)."""
        if not self.on_gpu:
            self._sampled = max(self._sampled, self.process.memory_info().rss / MB)

    def peak_mb(self) -> float:
        """The peak since `start()`: device bytes on a GPU, RSS growth over the baseline on CPU."""
        if self.on_gpu:
            peaks = [tf.config.experimental.get_memory_info(n)["peak"] / MB for n in self.devices]
            return float(max(peaks))
        self.sample()
        peak = self._sampled
        if self._high_water:
            peak = max(peak, _rss_high_water_mb() or 0.0)
        return max(peak - self.baseline_mb, 0.0)


def _device_memory_mb(name: str) -> float | None:
    index = int(name.rsplit(":", 1)[-1])
    for gpu in devices.list_gpus():
        if gpu.index == index and gpu.memory_mb:
            return float(gpu.memory_mb)
    return None


# Extra share of the extrapolated growth: measured peaks vary by several percent between runs.
HEADROOM = 1.25


def predict_mb(fitted: list[tuple[int, float]], batch_size: int) -> float | None:
    """Predicts the peak memory of `batch_size` from `(batch, peak_mb)` of probes that ran.

    Extrapolates linearly from the nearest measured batch below `batch_size` with the
    steepest growth per example seen between any two measurements (or, with a single
    measurement, memory proportional to the batch), plus `HEADROOM` of that growth for
    the allocator's noise — an over-estimate rather than an under-estimate, since an
    under-estimate on a CPU means the process is killed.
    """
    points = sorted(fitted)
    below = [(b, m) for b, m in points if b <= batch_size]
    if not below:
        return None
    base_batch, base_mb = below[-1]
    pairs = zip(points[:-1], points[1:], strict=True)
    slopes = [(m2 - m1) / (b2 - b1) for (b1, m1), (b2, m2) in pairs if b2 > b1]
    slope = max([s for s in slopes if s > 0], default=None)
    if slope is None:
        slope = base_mb / base_batch
    return base_mb + HEADROOM * slope * (batch_size - base_batch)
