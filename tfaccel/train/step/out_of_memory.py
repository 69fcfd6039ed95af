"""Out of memory: recognising it, and the one retry that answers it — smaller parts.

`split_until_fits` is the single memory-retry mechanism of tfaccel: the Trainer's
`on_oom="accumulate"` retries a batch that ran out of memory as k = 2, 4, 8, ...
micro-batches accumulated into one step, and `tfaccel.tuning.find_batch_size` retries a
first candidate that did not fit at half, a quarter, ... of it (the same k, one probe
each).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "OOM when allocating")


def is_out_of_memory(error: BaseException) -> bool:
    """True when `error` means a step ran out of memory.

    Covers `tf.errors.ResourceExhaustedError`, the `RESOURCE_EXHAUSTED` status XLA
    reports through other error types (e.g. `InternalError` from a compiled
    cluster), and Python's `MemoryError` from host-side allocations.
    """
    if isinstance(error, (tf.errors.ResourceExhaustedError, MemoryError)):
        return True
    text = str(error)
    if isinstance(error, tf.errors.OpError):
        return any(marker in text for marker in _OOM_MARKERS)
    return "RESOURCE_EXHAUSTED" in text


def describe_out_of_memory(error: BaseException) -> str:
    """One line naming the error and its most telling line (the allocation that failed)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    keys = (
        "OOM when allocating",
        "Out of memory",
        "out of memory",
        "Unable to allocate",
        "RESOURCE_EXHAUSTED",
        "MemoryError",
    )
    found = (next((line for line in lines if key in line), None) for key in keys)
    telling = next((line for line in found if line), None)
    return f"{type(error).__name__}: {(telling or (lines or [''])[0])[:200]}"


def split_until_fits(
    attempt: Callable[[int], bool | None], batch: int, *, replicas: int = 1, first: int = 2
) -> int | None:
    """Runs `attempt(k)` for k = first, 2·first, 4·first, ... until one fits; returns that k.

    `attempt(k)` runs the batch of `batch` examples as k parts. It fails by running out
    of memory (an error `is_out_of_memory` recognises; any other error propagates) or by
    returning False (e.g. a part predicted over a memory budget); anything else fits.
    Returns None when the next k would leave a replica less than one example per part.
    """
    k = first
    while batch // replicas // k >= 1:
        try:
            if attempt(k) is not False:
                return k
        except Exception as error:  # noqa: BLE001 - only out-of-memory means "smaller"
            if not is_out_of_memory(error):
                raise
        k *= 2
    return None
