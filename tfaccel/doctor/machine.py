"""What the doctor reads of the machine: GPUs, cores, device memory, the process's RSS."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import keras
import psutil
import tensorflow as tf

from tfaccel import devices

MB = 1024.0 * 1024.0


def gpus(strategy: tf.distribute.Strategy) -> list[str]:
    """The GPUs the strategy's worker runs on, as "GPU:i" (empty on a CPU)."""
    try:
        names = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):
        names = [d.name for d in tf.config.list_logical_devices()[:1]]
    out = []
    for name in names:
        spec = tf.DeviceSpec.from_string(name)
        if (spec.device_type or "").upper() == "GPU":
            out.append(f"GPU:{spec.device_index or 0}")
    return out


def capability(gpus: list[str]) -> tuple | None:
    if not gpus:
        return None
    for gpu in devices.list_gpus():
        if f"GPU:{gpu.index}" == gpus[0]:
            return tuple(gpu.compute_capability or ()) or None
    return None


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def variable_mb(*groups: Iterable[Any]) -> float:
    """Megabytes the variables of `groups` hold."""
    total = 0
    for group in groups:
        for v in group:
            total += int(tf.TensorShape(v.shape).num_elements() or 0) * tf.as_dtype(v.dtype).size
    return total / MB


def memory(
    gpus: list[str], model: keras.Model, optimizer: keras.optimizers.Optimizer
) -> dict[str, Any]:
    """The peak memory (a GPU's allocator, or the host's RSS) against its capacity."""
    fixed = variable_mb(model.variables, optimizer.variables)
    if gpus:
        peaks = [tf.config.experimental.get_memory_info(g)["peak"] / MB for g in gpus]
        capacity = None
        for gpu in devices.list_gpus():
            if f"GPU:{gpu.index}" == gpus[0] and gpu.memory_mb:
                capacity = float(gpu.memory_mb)
        return {
            "peak_mb": max(peaks),
            "capacity_mb": capacity,
            "what": f"{gpus[0]}'s memory",
            "fixed_mb": fixed,
        }
    high_water = rss_high_water_mb() or psutil.Process().memory_info().rss / MB
    return {
        "peak_mb": high_water,
        "capacity_mb": psutil.virtual_memory().total / MB,
        "what": "the host's RAM: this process's peak resident memory (CPU)",
        "fixed_mb": fixed,
    }


def rss_high_water_mb() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None
