"""The Trainer's sparse metrics when a method makes the labels one-hot (issue 68, item 6):
one mapping with `methods.for_fit` (`fitting.categorical_metric`): each metric keeps its
name in the logs, its settings (top-k's `k`) and its value, the crossentropy included."""

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import methods
from tfaccel.train.setup import methods_setup

RNG = np.random.default_rng(3)
X = RNG.normal(size=(48, 5)).astype("float32")
Y = RNG.integers(0, 4, size=48).astype("int32")


def build():
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="softmax", use_bias=False)]
    )


def test_sparse_metrics_keep_their_names_settings_and_values_under_label_smoothing():
    """Rate 0: the weights stay as built, so each epoch's metrics are the built model's
    on all 48 rows, computed here by hand from its predictions and the integer labels."""
    top2 = keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")
    trainer = tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.0),
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy", "sparse_categorical_crossentropy", top2],
        methods=[methods.LabelSmoothing(0.1)],
        jit_compile=False,
    )
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    history = trainer.fit(data, epochs=1, validation_data=data, verbose=0).history
    probabilities = build()(X).numpy()
    ranked = np.argsort(-probabilities, axis=1)
    want = {
        "sparse_categorical_accuracy": np.mean(ranked[:, 0] == Y),
        "sparse_categorical_crossentropy": np.mean(-np.log(probabilities[np.arange(48), Y])),
        "top2": np.mean((ranked[:, :2] == Y[:, None]).any(axis=1)),
    }
    assert 0 < want["sparse_categorical_accuracy"] < want["top2"] < 1  # k=2 kept, not 5
    for name, value in want.items():
        np.testing.assert_allclose(history[name], [value], rtol=1e-5)
        np.testing.assert_allclose(history[f"val_{name}"], [value], rtol=1e-5)


def test_the_trainer_maps_with_for_fits_mapping():
    """One mapping: the Trainer's made metric is `fitting.categorical_metric`'s, and keeps
    whether it is weighted."""
    metric = keras.metrics.SparseCategoricalCrossentropy(name="ce", from_logits=True)
    metric.tfaccel_weighted = True
    made = methods_setup.categorical(metric)
    assert type(made) is keras.metrics.CategoricalCrossentropy
    assert (made.name, made.get_config()["from_logits"], made.tfaccel_weighted) == (
        "ce",
        True,
        True,
    )
    plain = keras.metrics.MeanSquaredError()
    assert methods_setup.categorical(plain) is plain
    wrapped = keras.metrics.MeanMetricWrapper(keras.metrics.sparse_categorical_accuracy, "acc")
    made = methods_setup.categorical(wrapped)  # a Keras function the Trainer wrapped
    assert (type(made), made.name) == (keras.metrics.CategoricalAccuracy, "acc")
    own = keras.metrics.MeanMetricWrapper(lambda y, p: y, name="own")
    assert methods_setup.categorical(own) is own


def test_a_sparse_metric_function_is_mapped_in_the_trainer():
    """`metrics=[keras.metrics.sparse_categorical_accuracy]` (a function, as `for_fit`
    takes it) logs the built model's accuracy; it failed at step 1 on the labels' shape."""
    trainer = tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.0),
        loss="sparse_categorical_crossentropy",
        metrics=[keras.metrics.sparse_categorical_accuracy],
        methods=[methods.LabelSmoothing(0.1)],
        jit_compile=False,
    )
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    history = trainer.fit(data, epochs=1, verbose=0).history
    want = np.mean(build()(X).numpy().argmax(axis=1) == Y)
    np.testing.assert_allclose(history["sparse_categorical_accuracy"], [want], rtol=1e-6)
