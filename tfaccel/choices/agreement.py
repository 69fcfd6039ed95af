"""Values the workers of a multi-worker job must agree on before they act on them.

Under `MultiWorkerMirroredStrategy` every worker must run the same calls in the same
order (their collectives pair up one for one), so a size chosen from this worker's own
timings (steps per loop, the doctor's probe sizes) first goes through `agree`.
"""

from __future__ import annotations

import tensorflow as tf


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether the strategy spans several workers (their calls must match one for one)."""
    extended = getattr(strategy, "extended", None)
    return int(getattr(extended, "_num_workers", 1) or 1) > 1


def agree(strategy: tf.distribute.Strategy, value: float) -> float:
    """The largest `value` over the workers (itself on one worker)."""
    if not is_multi_worker(strategy):
        return value
    values = _gather(strategy)(tf.constant([float(value)], tf.float64))
    return float(tf.reduce_max(values))


_GATHERS: dict = {}


def _gather(strategy):
    """A `tf.function` gathering one value per replica (compiled once per strategy)."""
    if id(strategy) not in _GATHERS:
        _GATHERS[id(strategy)] = tf.function(
            lambda v: strategy.gather(strategy.run(lambda: tf.identity(v)), axis=0)
        )
    return _GATHERS[id(strategy)]
