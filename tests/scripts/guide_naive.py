"""A user's script, shaped like TensorFlow's tf.data guide's naive example: a generator
with simulated open and read latency, read one element at a time, trained by a small
compiled Keras model. `tfaccel doctor` must diagnose it unchanged.

`--arrays` trains on NumPy arrays instead (model.fit(x, y, batch_size=...))."""

import sys
import time

import keras
import numpy as np
import tensorflow as tf

OPEN_S, READ_S = 0.01, 0.005


def samples(count=8):
    time.sleep(OPEN_S)  # opening the file
    for index in range(count):
        time.sleep(READ_S)  # reading one record
        yield np.full((8,), index / count, np.float32), np.int64(index % 2)


spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((), tf.int64))
data = tf.data.Dataset.from_generator(samples, output_signature=spec).batch(2)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu")])
model.add(keras.layers.Dense(2))
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
if "--arrays" in sys.argv:
    x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
    model.fit(x, np.zeros(64, np.int64), batch_size=16, epochs=2, verbose=0)
else:
    model.fit(data, epochs=2, verbose=0)
print("AFTER FIT: the script went on")
