"""`OOMAbove`: a layer that runs out of memory for real above a batch size (shared by the
out-of-memory, tuning and largest-batch tests)."""

import keras
import numpy as np
import tensorflow as tf


def _host_terabytes(batch):
    return np.empty((int(batch), 2**40), np.float32).sum(dtype=np.float32)


class OOMAbove(keras.layers.Layer):
    """Runs out of memory for real when its batch exceeds `threshold`.

    The failing allocation is a host one (numpy, terabytes: MemoryError at once, which
    TensorFlow raises as `ResourceExhaustedError`); with `device=True` it is a TensorFlow
    tensor, whose allocator retries for 10 s before it raises.
    """

    def __init__(self, threshold, device=False, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold
        self.device = device

    def call(self, x):
        def allocate_terabytes():
            if self.device:
                return x + tf.reduce_sum(tf.random.uniform([2**40]))
            total = tf.numpy_function(_host_terabytes, [tf.shape(x)[0]], tf.float32)
            return x + tf.ensure_shape(total, [])

        return tf.cond(tf.shape(x)[0] > self.threshold, allocate_terabytes, lambda: x)
