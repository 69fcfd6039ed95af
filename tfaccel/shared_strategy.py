"""One strategy per set of devices in a process.

Two strategies whose all-reduce runs on TensorFlow's collective ops (a plain
`tf.distribute.MirroredStrategy`, `MultiWorkerMirroredStrategy`) number their collectives
from the same keys, and the process remembers each key's shape. Over the same devices,
the second strategy's steps then fail, e.g. "Shape mismatch in the collective instance
100 ... [603] vs [63]" — alternating with the first, and even after the first is gone.
One shared strategy works.

So `tfaccel.devices.strategy(...)` hands out the strategy it already made for the same
request (`cached` / `keep`), and the Trainer refuses a second collective strategy over
devices that another one already uses (`check_alone`), naming the first.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import types

import tensorflow as tf

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_lock = threading.Lock()
_made: dict[tuple, tf.distribute.Strategy] = {}  # devices.strategy's, for the process
# Collective strategies tfaccel made or used, and where: kept, as their collectives' keys
# outlive them.
_known: list[tuple[tf.distribute.Strategy, str]] = []


def cached(key: tuple) -> tf.distribute.Strategy | None:
    """The strategy `devices.strategy` made for `key` in this process, or None."""
    with _lock:
        return _made.get(key)


def keep(key: tuple, strategy: tf.distribute.Strategy) -> tf.distribute.Strategy:
    """Remembers `strategy` as the one for `key`; returns it."""
    with _lock:
        _made[key] = strategy
    remember(strategy, _caller())
    return strategy


def remember(strategy: tf.distribute.Strategy, where: str | None = None) -> None:
    """Records that tfaccel uses `strategy`, and where (the caller's file and line).

    Only collective strategies are kept: the others cannot collide.
    """
    if not uses_collectives(strategy):
        return
    with _lock:
        if any(known is strategy for known, _ in _known):
            return
        _known.append((strategy, where or _caller()))


def uses_collectives(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` all-reduces with collective ops (keys that can collide)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return False
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return type(ops).__name__ == "CollectiveAllReduce"


def devices_of(strategy: tf.distribute.Strategy) -> set[str]:
    """The canonical names of the devices `strategy` replicates over."""
    try:
        names = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy
        return set()
    return {tf.DeviceSpec.from_string(n).to_string() for n in names}


def check_alone(strategy: tf.distribute.Strategy, user: str = "tfaccel.Trainer") -> None:
    """Raises ValueError when another collective strategy shares devices with `strategy`.

    The other strategy is one tfaccel made or used in this process, or any still alive.
    Records `strategy` otherwise.
    """
    first = _rival(strategy)
    if first is None:
        remember(strategy)
        return
    other, where = first
    shared = sorted(devices_of(strategy) & devices_of(other))
    raise ValueError(
        f"{user} was given a second {type(strategy).__name__} over {shared}, which "
        f"{type(other).__name__} {hex(id(other))} (first seen at {where}) already uses. "
        "Two strategies with collective all-reduce over the same devices in one process "
        "break each other's steps, even once the first is gone (TensorFlow: 'Shape "
        "mismatch in the collective instance ...'). Make one strategy and share it: pass "
        "strategy=<the first one> (tfaccel.devices.strategy(...) returns the same "
        "strategy for the same devices)."
    )


def _rival(strategy) -> tuple[tf.distribute.Strategy, str] | None:
    """Another live collective strategy sharing a device with `strategy`, and where it was seen.

    Strategies tfaccel has seen come first; then any other alive in the process (a
    hand-written loop's own `tf.distribute.MirroredStrategy()`), found among the live
    objects: only for a collective `strategy`, once per Trainer.
    """
    if not uses_collectives(strategy):
        return None
    mine = devices_of(strategy)
    with _lock:
        entries = list(_known)
    seen = {id(other) for other, _ in entries}
    others = (o for o in gc.get_objects() if issubclass(type(o), tf.distribute.Strategy))
    entries += [(o, "a strategy made outside tfaccel") for o in others if id(o) not in seen]
    for other, where in entries:
        if other is not strategy and uses_collectives(other) and devices_of(other) & mine:
            return other, where
    return None


def _caller() -> str:
    """file:line of the first frame outside tfaccel (where the user asked)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_PACKAGE):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"
