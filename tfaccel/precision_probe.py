"""The operation-level precision probe behind `precision.choose()` on this machine.

Times a matmul and a convolution of typical training sizes under each candidate's
compute dtype, in alternating rounds after a warm-up, for at most `BUDGET_S` seconds,
once per process (the result is cached). A training step mixes these with element-wise
work, so the Trainer's `precision="auto"` times the model's own step instead.
"""

from __future__ import annotations

import functools
import time

import keras
import tensorflow as tf

BUDGET_S = 2.0
WHAT = "a 1024x1024 matmul and a 3x3 convolution (32x32x64, batch 16)"


def _ops(dtype: tf.DType):
    """`[(fn, args, flops)]`: the probe's operations in `dtype`."""
    normal = tf.random.stateless_normal
    a = tf.cast(normal([1024, 1024], seed=[1, 2]), dtype)
    images = tf.cast(normal([16, 32, 32, 64], seed=[3, 4]), dtype)
    kernel = tf.cast(normal([3, 3, 64, 64], seed=[5, 6]) * 0.05, dtype)

    @tf.function
    def matmul(x):
        return tf.reduce_sum(tf.cast(tf.matmul(x, x)[:1, :1], tf.float32))

    @tf.function
    def conv(x, k):
        y = tf.nn.conv2d(x, k, strides=1, padding="SAME")
        return tf.reduce_sum(tf.cast(y[:1, :1, :1, :1], tf.float32))

    return [
        (matmul, (a,), 2 * 1024**3),
        (conv, (images, kernel), 2 * 16 * 32 * 32 * 64 * 64 * 9),
    ]


def _seconds(fn, args) -> float:
    start = time.perf_counter()
    fn(*args).numpy()  # the result read back: the clock stops after the work
    return time.perf_counter() - start


@functools.cache
def op_rates(policies: tuple[str, ...], budget_s: float = BUDGET_S) -> dict[str, float]:
    """FLOP/s of the probe's operations under each policy's compute dtype (best of the
    alternating rounds that fit in `budget_s`, at least one after the warm-up)."""
    began = time.perf_counter()
    ops = {p: _ops(tf.as_dtype(keras.DTypePolicy(p).compute_dtype)) for p in policies}
    best = {p: [float("inf")] * len(ops[p]) for p in policies}
    for p in policies:  # warm-up: tracing and the kernels' first run
        for fn, args, _ in ops[p]:
            _seconds(fn, args)
    rounds = 0
    while rounds < 1 or (rounds < 5 and time.perf_counter() - began < budget_s):
        for p in policies if rounds % 2 == 0 else reversed(policies):
            for i, (fn, args, _) in enumerate(ops[p]):
                best[p][i] = min(best[p][i], _seconds(fn, args))
        rounds += 1
    return {p: sum(f for _, _, f in ops[p]) / sum(best[p]) for p in policies}
