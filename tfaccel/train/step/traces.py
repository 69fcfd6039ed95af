"""Counts and times the traces of the step loops.

`tf.function` runs a loop's Python body only when it traces it, so a wrapper around the
body sees each trace: `counted` adds one to its owner's `Counter` and tells the listeners
(e.g. `tfaccel.train.setup.startup`, which charges the seconds to a start-up phase) how
long the trace took, AutoGraph's conversion of what the body calls included. The
gradient registrations a trace leaves in TensorFlow's registry are dropped when it ends
(`registrations`).
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.train.step import registrations

_LISTENERS: list[Callable[[str, float], None]] = []


def counted(
    fn: Callable[..., Any], name: str, counter: collections.Counter[str]
) -> Callable[..., Any]:
    """`fn` (a loop's Python body), counting and timing each trace under `name`."""

    @tf.autograph.experimental.do_not_convert  # `fn` is plain, or converted already
    @functools.wraps(fn)
    def body(*args, **kwargs):
        began = time.perf_counter()
        try:
            with registrations.dropped_after_trace():  # else each trace's graph is kept
                return fn(*args, **kwargs)
        finally:
            counter[name] += 1
            seconds = time.perf_counter() - began
            for listener in list(_LISTENERS):
                listener(name, seconds)

    return body


def listen(listener: Callable[[str, float], None]) -> Callable[[], None]:
    """Calls `listener(name, seconds)` after each trace; returns the function that stops it."""
    _LISTENERS.append(listener)

    def stop() -> None:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)

    return stop
