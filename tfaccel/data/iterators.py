"""Freeing tf.data iterators off the training thread.

Deleting an iterator whose pipeline autotunes (tf.data's default) blocks until
tf.data's autotuning thread next wakes up; it sleeps 10 ms, then twice as long each
time, up to 60 s. So dropping an iterator waits until the next of 0.01, 0.03, ...,
2.55, 5.11, 10.23, ... s after it was created: measured here (TensorFlow 2.21,
2-core CPU), an iterator dropped after 1.5 s waited 1.04 s, after 3 s 2.10 s, after
0.5 s or 6 s about 1 ms; with autotuning off it never waited. `adopt` hands such
waits to the background.

Each unused object is freed on a thread of its own, so one long wait never delays
another (a single reaper thread, freeing in turn, made later objects wait behind
earlier ones: the backlog was the sum of the waits, now it is the longest one). An
object's memory is therefore held at most until its own pipeline's autotuner wakes.

Memory freed on another thread stays in glibc's per-thread arenas: 100 `fit` calls
(300 iterators, a 20 MB shuffle buffer each) grew the resident memory by 90 MB and
stayed there. So once the last pending deletion ends, the reaper hands the free pages
back to the system (`malloc_trim`): the growth fell to under 10 MB
(`benchmarks/iterator_memory.py`).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import tensorflow as tf

T = TypeVar("T")

_POLL_S = 0.05
_THREAD_NAME = "tfaccel-iterator-reaper"


def _malloc_trim() -> Callable[[], object]:
    """glibc's `malloc_trim(0)`, or a no-op where the C library has none."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


class _Reaper:
    """Holds adopted objects; frees each on its own thread once nothing else holds it."""

    def __init__(self) -> None:
        self._held: dict[int, object] = {}
        self._freeing: set[threading.Thread] = set()
        self._changed = threading.Condition()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._stats = {"adopted": 0, "freed": 0, "longest_free_s": 0.0, "most_pending": 0}

    def adopt(self, obj: object) -> None:
        """Holds `obj` until nothing else does, then frees it on a thread of its own."""
        with self._changed:
            self._held[id(obj)] = obj
            self._stats["adopted"] += 1
            self._note_pending()
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name=_THREAD_NAME, daemon=True)
                self._watcher.start()

    def pending(self) -> int:
        """Objects held or being freed."""
        with self._changed:
            return len(self._held) + len(self._freeing)

    def stats(self) -> dict[str, float]:
        """The counts `stats()` returns."""
        with self._changed:
            return dict(self._stats, pending=len(self._held) + len(self._freeing))

    def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Waits until `condition()` holds, re-checked after each object is freed."""
        with self._changed:
            return self._changed.wait_for(condition, timeout=timeout_s)

    def close(self) -> None:
        """At exit: stops the threads and frees what is left on the caller's thread.

        A daemon thread still inside TensorFlow when the interpreter finalizes is stopped
        by a forced unwind through C++ frames, which aborts the process ("exception not
        rethrown"); so the threads are joined first, while the interpreter is whole.
        """
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._changed:
            freeing = list(self._freeing)
        for thread in freeing:
            thread.join()
        with self._changed:
            left = list(self._held.values())
            self._held.clear()
        del left

    def _note_pending(self) -> None:
        pending = len(self._held) + len(self._freeing)
        self._stats["most_pending"] = max(self._stats["most_pending"], pending)

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            with self._changed:
                # Held only here: the dict's reference and getrefcount's argument.
                unused = [key for key in self._held if sys.getrefcount(self._held[key]) <= 2]
                for key in unused:
                    box = [self._held.pop(key)]
                    thread = threading.Thread(
                        target=self._free, args=(box,), name=_THREAD_NAME, daemon=True
                    )
                    self._freeing.add(thread)
                    thread.start()
                    del box

    def _free(self, box: list) -> None:
        start = time.monotonic()
        box.pop()  # the last reference: the deletion (and its wait) happens here
        waited = time.monotonic() - start
        with self._changed:
            self._freeing.discard(threading.current_thread())
            self._stats["freed"] += 1
            self._stats["longest_free_s"] = max(self._stats["longest_free_s"], waited)
            last = not self._freeing
        if last:
            _TRIM()  # the freed pages back to the system (see the module docstring)
        with self._changed:
            self._changed.notify_all()


_REAPER = _Reaper()
atexit.register(_REAPER.close)  # registered after TensorFlow's import: runs before its own


def adopt(iterator: T) -> T:
    """Returns `iterator`, to be freed on a background thread when the caller drops it.

    The iterator works as before; only its deletion moves off the caller's thread.
    """
    _REAPER.adopt(iterator)
    return iterator


def pending() -> int:
    """How many adopted iterators are still held (in use, or waiting to be freed)."""
    return _REAPER.pending()


def stats() -> dict[str, float]:
    """Counts since the process started: adopted, freed, pending, most_pending (at
    once), longest_free_s (the longest a deletion waited)."""
    return _REAPER.stats()


def wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    """Waits until `condition()` is true, re-checking whenever an iterator is freed.

    Returns whether it became true within `timeout_s` (one deletion may wait up to
    tf.data's 60 s autotuning period).
    """
    return _REAPER.wait_for(condition, timeout_s)


def freed_in_background(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`, whose iterators are freed off the caller's thread (see the module
    docstring): for `model.fit`, which makes a new iterator each epoch and drops the
    last on its training thread, waiting up to seconds for tf.data's autotuner.

    The elements, their order and the dataset's options are unchanged; only the eager
    `iter(...)` differs (a dataset transformed further is a plain one again).

    Raises:
        TypeError: `dataset` is not a `tf.data.Dataset`.
    """
    import tensorflow as tf

    from tfaccel.data import graph

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"freed_in_background takes a tf.data.Dataset, got {type(dataset)}.")
    if graph.passed_through_with(dataset) is adopt:
        return dataset
    return graph.passed_through(dataset, adopt)
