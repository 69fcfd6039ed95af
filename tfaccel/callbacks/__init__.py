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

from collections.abc import Iterable
from typing import Any

import keras

from tfaccel.callbacks.bottleneck import Bottleneck
from tfaccel.callbacks.host_gap import HostGap
from tfaccel.callbacks.lr_scaling import LinearScalingWarmup
from tfaccel.callbacks.memory import DeviceMemory
from tfaccel.callbacks.profiling import ProfileSteps
from tfaccel.callbacks.sync_bn import SyncMovingStatistics
from tfaccel.callbacks.throughput import Throughput

__all__ = [
    "Bottleneck",
    "DeviceMemory",
    "HostGap",
    "LinearScalingWarmup",
    "ProfileSteps",
    "SyncMovingStatistics",
    "Throughput",
    "ordered",
]


def _as_list(callbacks: Any) -> list:
    """Returns `callbacks` (None, one callback, or an iterable of them) as a list.

    Raises:
        TypeError: an item that is not a `keras.callbacks.Callback`.
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        return [callbacks]
    try:
        items = list(callbacks)
    except TypeError:
        items = [callbacks]
    bad = [c for c in items if not isinstance(c, keras.callbacks.Callback)]
    if bad:
        raise TypeError(
            f"callbacks must be keras.callbacks.Callback objects, got {bad[0]!r} "
            f"({type(bad[0]).__name__}). Pass a Callback instance (note the parentheses: "
            "Throughput(), not Throughput), a list of them, or None."
        )
    return items


_PRODUCERS = (
    Throughput,
    DeviceMemory,
    ProfileSteps,
    LinearScalingWarmup,
    HostGap,
    Bottleneck,
)


def ordered(
    callbacks: keras.callbacks.Callback | Iterable[keras.callbacks.Callback] | None,
) -> list[keras.callbacks.Callback]:
    """Returns `callbacks` with tfaccel's callbacks moved first (stable order otherwise).

    Their epoch values then reach `TensorBoard`, `CSVLogger` and any other callback
    that reads the logs. Like `model.fit`, it accepts None or a single callback.

    Raises:
        TypeError: an item that is not a `keras.callbacks.Callback`.
    """
    callbacks = _as_list(callbacks)
    ours = [c for c in callbacks if isinstance(c, _PRODUCERS)]
    return ours + [c for c in callbacks if not isinstance(c, _PRODUCERS)]
