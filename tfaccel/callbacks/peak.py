"""What this machine can compute: its matmul peak per precision, and a model's FLOPs per example."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfaccel.parallel.costs import graph_flops

if TYPE_CHECKING:
    import keras


class MatmulPeak:
    """This machine's matmul FLOP/s in `dtype`, measured a few calls at a time.

    Each call runs 8 chained n×n matmuls (16 n³ FLOPs) inside one `tf.function`; the
    fastest call counts (on a shared machine noise only slows a call down). Calls can be
    spread between other measurements, so that both see the same load.

    Args:
        n: the matrices' size (2048: near the peak on CPUs; 1024 is within a few % and
            8x cheaper).
        device: where to run it (default: TensorFlow's default device).
        dtype: the matrices' type (a policy's compute dtype, e.g. "bfloat16").
    """

    def __init__(self, n: int = 2048, device: str | None = None, dtype: str = "float32") -> None:
        self.n, self.device, self.dtype = n, device, dtype
        self.best = 0.0
        with self._placed():
            self._a = tf.cast(tf.random.normal((n, n)), dtype)
            b = tf.cast(tf.random.normal((n, n)) / n, dtype)

        @tf.function
        def chain(x, steps):
            for _ in tf.range(steps):
                x = tf.matmul(x, b)
            return tf.reduce_sum(tf.cast(x, tf.float32))

        self._chain = chain
        with self._placed():
            chain(self._a, tf.constant(2)).numpy()  # warm-up (tracing)

    def _placed(self):
        return tf.device(self.device) if self.device else contextlib.nullcontext()

    def measure(self, calls: int = 1) -> float:
        """Times `calls` calls; returns the best FLOP/s so far."""
        with self._placed():
            for _ in range(calls):
                start = time.perf_counter()
                self._chain(self._a, tf.constant(8)).numpy()
                self.best = max(self.best, 16 * self.n**3 / (time.perf_counter() - start))
        return self.best


def matmul_peak(
    n: int = 2048, repeats: int = 10, device: str | None = None, dtype: str = "float32"
) -> float:
    """Best FLOP/s of `repeats` calls of `MatmulPeak(n, device, dtype)`."""
    return MatmulPeak(n, device, dtype).measure(repeats)


def best_matmul_peak(
    policies: Iterable[str], n: int = 2048, repeats: int = 10
) -> tuple[float, str]:
    """`(FLOP/s, policy)`: the highest matmul peak among `policies`' compute dtypes."""
    import keras

    peaks = {p: matmul_peak(n, repeats, dtype=keras.DTypePolicy(p).compute_dtype) for p in policies}
    best = max(peaks, key=lambda p: peaks[p])
    return peaks[best], best


def training_flops_per_example(model: keras.Model, x_spec: Any) -> float | None:
    """Forward + backward FLOPs of one example: 3 × the forward pass's (TF's op counts).

    Args:
        model: a built Keras model.
        x_spec: the features' `tf.TensorSpec` (or a structure of them), batch first.

    Returns:
        The estimate, or None when the forward pass cannot be profiled (unknown
        shapes, ops without a FLOP count).
    """
    try:
        example = tf.nest.map_structure(
            lambda s: tf.zeros((1, *s.shape[1:]), dtype=s.dtype), x_spec
        )

        def forward():
            return model(example, training=False)

        flops = graph_flops(tf.function(forward).get_concrete_function().graph)
    except (ValueError, TypeError, tf.errors.OpError):
        return None
    return 3.0 * flops if flops > 0 else None
