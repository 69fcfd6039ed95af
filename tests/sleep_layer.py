"""`Sleep`: a layer whose forward pass sleeps a known time, so that a test of a measured
verdict or ratio controls the step it measures (a busy host cannot make it short)."""

import time

import keras
import numpy as np
import tensorflow as tf


class Sleep(keras.layers.Layer):
    """Returns its input after sleeping `seconds` (a `py_function`: no XLA)."""

    supports_jit = False

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        def sleep():
            time.sleep(self.seconds)
            return np.float32(0.0)

        done = tf.py_function(sleep, [], tf.float32)
        done.set_shape([])
        return x + done
