"""Comparing two trainings of one deep model: in float64, where equality means something.

Measured on the pipelined ResNet-18 of test_parallel (width 4, 4 SGD steps at 0.1, the
pipeline against model.fit) over 10 seeds x 1 and 2 threads: in float32 the largest weight
gap was below 1e-5 of the largest weight in 19 runs (median 1.3e-6) and 9.5e-3 in one, where
rounding flipped a ReLU or a max near a tie and training went another way; in float64 every
run ended within 1.1e-13. So a float32 comparison of a deep model after training is either
loose enough to pass a real bug (a lost micro-batch moves weights ~1e-2) or flaky; the same
comparison in float64 is tight, and proves the two compute the same function.
"""

import contextlib

import keras
import numpy as np

FLOAT64_RTOL = 1e-11  # 100x the largest float64 gap measured


@contextlib.contextmanager
def float64():
    """Keras builds float64 layers inside the block (floatx and the dtype policy)."""
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def weight_gap(a, b) -> float:
    """The largest weight difference of models `a` and `b`, relative to `a`'s largest weight."""
    pairs = list(zip(a.get_weights(), b.get_weights(), strict=True))
    assert all(x.shape == y.shape for x, y in pairs)
    gap = max(float(np.abs(x - y).max()) for x, y in pairs)
    return gap / max(float(np.abs(x).max()) for x, _ in pairs)
