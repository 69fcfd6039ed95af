"""DeviceMemory: current and peak memory per GPU, and host RSS."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import keras
import psutil
import tensorflow as tf

from tfaccel.callbacks._steps import MB, positive_int, user_stacklevel


class DeviceMemory(keras.callbacks.Callback):
    """Current and peak memory per GPU, and host RSS, in the epoch logs.

    Per GPU `i`: `mem_gpu{i}_mb` (current) and `mem_gpu{i}_peak_mb` (peak since
    the epoch began: the peak is reset at each epoch start). Host:
    `mem_host_rss_mb` and `mem_host_rss_peak_mb` (highest sample this epoch). On a
    machine without GPUs only the host keys are reported, with one warning per process.

    Args:
        devices: "all" logical GPUs, or a list of GPU indices / names ("GPU:1").
        every: also sample every this many batch calls and add the values to those
            batch logs (seen by `TensorBoard(update_freq=...)`); None: epochs only.

    Raises:
        ValueError: a non-positive `every`, malformed `devices`, or (at the start of
            training) a named GPU that does not exist.
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    _warned_no_gpu = False

    def __init__(
        self, devices: str | Sequence[int | str] = "all", every: int | None = None
    ) -> None:
        super().__init__()
        self.devices: str | list[str] = "all"  # or GPU names
        if devices != "all":
            if isinstance(devices, (str, int)) or not all(
                isinstance(d, (str, int)) and not isinstance(d, bool) for d in devices
            ):
                raise ValueError(
                    f'devices must be "all" or a list of GPU indices or names, got {devices!r}.'
                )
            self.devices = [self._name(d) for d in devices]
        self.every = positive_int("every", every, allow_none=True)
        self._process = psutil.Process()

    @staticmethod
    def _name(device: int | str) -> str:
        if isinstance(device, int):
            return f"GPU:{device}"
        spec = tf.DeviceSpec.from_string(device)
        if (spec.device_type or "").upper() != "GPU":
            raise ValueError(f"DeviceMemory watches GPUs; {device!r} is not a GPU name.")
        return f"GPU:{spec.device_index or 0}"

    def on_train_begin(self, logs: dict | None = None) -> None:
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
        if not self._gpus and not DeviceMemory._warned_no_gpu:
            DeviceMemory._warned_no_gpu = True  # once per process: it is a fact of the machine
            warnings.warn(
                "DeviceMemory: no GPU is visible, so only host memory (RSS) is reported "
                "(`tfaccel devices` says why).",
                stacklevel=user_stacklevel(),
            )
        self._calls = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        for gpu in self._gpus:
            tf.config.experimental.reset_memory_stats(gpu)
        self._host_peak = 0.0
        self._calls = 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._calls += 1
        if self.every and self._calls % self.every == 0:
            values = self.sample()
            if logs is not None:
                logs.update(values)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        values = self.sample()
        if logs is not None:
            logs.update(values)

    def sample(self) -> dict:
        """Returns the current memory values (MiB) under their log keys."""
        values = {}
        for gpu in self._gpus:
            info = tf.config.experimental.get_memory_info(gpu)
            index = gpu.split(":")[1]
            values[f"mem_gpu{index}_mb"] = info["current"] / MB
            values[f"mem_gpu{index}_peak_mb"] = info["peak"] / MB
        rss = self._process.memory_info().rss / MB
        self._host_peak = max(getattr(self, "_host_peak", 0.0), rss)
        values["mem_host_rss_mb"] = rss
        values["mem_host_rss_peak_mb"] = self._host_peak
        return values
