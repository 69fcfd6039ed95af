"""The label / output / loss contract (issue 21, section 1), checked before the first step.

Each row provokes one mismatch through the Trainer (or `tfaccel.data.check`, as a
`model.fit` user calls it) and names the exception type and the words that name
the cause and the fix.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import data

X = np.zeros((8, 4), np.float32)
Y = np.array([0, 1, 2, 1, 0, 1, 2, 0], np.int32)
ONE_HOT = np.eye(3, dtype=np.float32)[Y]


def dense(units, activation=None):
    def build():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(units, activation=activation)(inputs))

    return build


def batches(y, x=X, batch=4):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def fit(y, loss, units=3, activation=None, **kwargs):
    trainer = tfaccel.Trainer(
        dense(units, activation), loss=loss, strategy=tf.distribute.get_strategy()
    )
    return trainer.fit(batches(y), epochs=1, verbose=0, **kwargs)


def check(y, loss, units=3):
    data.check(batches(y), dense(units)(), loss)


def squared_error(y_true, y_pred):  # a custom loss: no kind known, shapes tried instead
    return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)


def nan_in_a_later_batch():
    y = Y.astype(np.float32)
    y[6] = np.nan  # the second batch; the up-front check reads only the first
    fit(y, "sparse_categorical_crossentropy")


def nan_label_with_check_finite():
    y = Y.astype(np.float32)
    y[5] = np.nan
    ds = data.pipeline(data.from_arrays(X, y), batch_size=4, training=False, check_finite=True)
    for _ in ds:
        pass


CASES = [
    ("mse_labels_B_outputs_B3", lambda: fit(Y.astype(np.float32), "mse"), ValueError,
     ["'mean_squared_error'", "labels (B,)", "model outputs (B, 3)", "Make the labels (B, 3)"]),
    ("mse_int_labels_look_like_classes", lambda: fit(Y, "mse"), ValueError,
     ["labels (B,)", "(B, 3)", "use sparse_categorical_crossentropy"]),
    ("mse_B1_outputs_B2_broadcast", lambda: fit(X[:, :1], "mse", units=2), ValueError,
     ["labels (B, 1) against outputs (B, 2) would broadcast", "'mean_squared_error'",
      "labels of the outputs' shape (B, 2)"]),
    ("mae_object_broadcast", lambda: fit(X[:, :1], keras.losses.MeanAbsoluteError(), units=2),
     ValueError, ["'mean_absolute_error'", "(B, 1) against outputs (B, 2) would broadcast"]),
    ("huber_B3_outputs_B2", lambda: fit(X[:, :3], keras.losses.Huber(), units=2), ValueError,
     ["'huber'", "labels (B, 3) and model outputs (B, 2)", "Make the labels (B, 2)"]),
    ("categorical_int_labels", lambda: fit(Y, "categorical_crossentropy"), ValueError,
     ["'categorical_crossentropy'", "labels (B,) and model outputs (B, 3)",
      "sparse_categorical_crossentropy for integer labels", "tf.one_hot(labels, 3)"]),
    ("categorical_object_labels_B1",
     lambda: fit(Y[:, None], keras.losses.CategoricalCrossentropy(from_logits=True)),
     ValueError, ["labels (B, 1)", "integer class indices", "sparse_categorical_crossentropy"]),
    ("categorical_focal_int_labels", lambda: fit(Y, "categorical_focal_crossentropy"),
     ValueError, ["'categorical_focal_crossentropy'", "sparse_categorical_crossentropy"]),
    ("kl_divergence_int_labels", lambda: fit(Y, "kld"), ValueError,
     ["'kl_divergence'", "one-hot labels", "sparse_categorical_crossentropy"]),
    ("categorical_5_columns_3_outputs",
     lambda: fit(np.zeros((8, 5), np.float32), "categorical_crossentropy"), ValueError,
     ["labels (B, 5) and model outputs (B, 3)", "Make the labels (B, 3)", "output (B, 5)"]),
    ("binary_labels_B_outputs_B3", lambda: fit(Y.astype(np.float32), "binary_crossentropy"),
     ValueError, ["'binary_crossentropy'", "labels (B,) and model outputs (B, 3)",
                  "use sparse_categorical_crossentropy", "give the last layer 1 unit"]),
    ("hinge_labels_B_outputs_B3", lambda: fit(Y.astype(np.float32), "hinge"), ValueError,
     ["'hinge'", "one label per example against 3 outputs"]),
    ("binary_labels_above_one",
     lambda: fit(Y, "binary_crossentropy", units=1, activation="sigmoid"), ValueError,
     ["takes targets in [0, 1]", "labels hold 2", "one unit per class",
      "sparse_categorical_crossentropy"]),
    ("binary_focal_negative_labels",
     lambda: fit(-Y.astype(np.float32), "binary_focal_crossentropy", units=1), ValueError,
     ["'binary_focal_crossentropy'", "labels hold -2", "labels 0 and 1"]),
    ("one_hot_with_sparse", lambda: fit(ONE_HOT, "sparse_categorical_crossentropy"), ValueError,
     ["labels (B, 3) and model outputs (B, 3) look one-hot",
      "Use categorical_crossentropy for one-hot labels", "tf.argmax"]),
    ("sparse_labels_B2_outputs_B3",
     lambda: fit(np.zeros((8, 2), np.int32), "sparse_categorical_crossentropy"), ValueError,
     ["one integer class index per example", "labels (B, 2) and model outputs (B, 3)"]),
    ("sparse_single_output_unit",
     lambda: fit(Y % 2, keras.losses.SparseCategoricalCrossentropy(), units=1), ValueError,
     ["single output unit", "binary_crossentropy with a sigmoid", "one unit per class"]),
    ("string_labels_sparse",
     lambda: fit(np.array(["cat", "dog"] * 4), "sparse_categorical_crossentropy"), ValueError,
     ["labels are strings", "'sparse_categorical_crossentropy'",
      "data.from_csv(..., label_vocabulary=", "keras.layers.StringLookup"]),
    ("string_labels_mse", lambda: fit(np.array(["1.5", "2"] * 4), "mse", units=1), ValueError,
     ["labels are strings", "needs numbers", "StringLookup"]),
    ("fractional_labels_sparse",
     lambda: fit(Y + np.float32(0.5), "sparse_categorical_crossentropy"),
     ValueError, ["integer class indices", "fractions (e.g. 0.5)", "'categorical_crossentropy'"]),
    ("nan_label_first_batch",
     lambda: fit(np.where(Y == 1, np.nan, Y).astype(np.float32), "sparse_categorical_crossentropy"),
     ValueError, ["labels of the first batch hold nan", "not finite", "check_finite=True"]),
    ("nan_label_later_batch", nan_in_a_later_batch, ValueError,
     ["label is NaN or inf", "-9223372036854775808", "check_finite=True"]),
    ("nan_label_check_finite", nan_label_with_check_finite, tf.errors.InvalidArgumentError,
     ["element 5 of the source", "non-finite label", "impute"]),
    ("custom_loss_bad_shapes", lambda: fit(Y.astype(np.float32), squared_error), ValueError,
     ["'squared_error' fails on labels (B,)", "model outputs (B, 3)", "Incompatible shapes",
      "Make the labels fit"]),
    ("validation_labels_checked",
     lambda: fit(ONE_HOT, "categorical_crossentropy", validation_data=batches(Y)), ValueError,
     ["'categorical_crossentropy'", "labels (B,)", "sparse_categorical_crossentropy"]),
    ("check_for_model_fit_users", lambda: check(Y.astype(np.float32), "mse"), ValueError,
     ["'mean_squared_error'", "labels (B,) and model outputs (B, 3)"]),
    ("check_loss_function", lambda: check(Y, keras.losses.categorical_crossentropy), ValueError,
     ["'categorical_crossentropy'", "sparse_categorical_crossentropy for integer labels"]),
]  # fmt: skip


@pytest.mark.parametrize("provoke, kind, words", [pytest.param(*r[1:], id=r[0]) for r in CASES])
def test_label_mismatch_is_explained(provoke, kind, words):
    with pytest.raises(kind) as caught:
        provoke()
    message = str(caught.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{missing} not in: {message}"


@pytest.mark.parametrize(
    "y, loss, units",
    [
        pytest.param(Y, "sparse_categorical_crossentropy", 3, id="sparse_B"),
        pytest.param(Y[:, None], keras.losses.SparseCategoricalCrossentropy(), 3, id="sparse_B1"),
        pytest.param(ONE_HOT, "categorical_crossentropy", 3, id="one_hot"),
        pytest.param(ONE_HOT.astype(np.int32), "categorical_crossentropy", 3, id="one_hot_int"),
        pytest.param(Y % 2, "binary_crossentropy", 1, id="binary_B_vs_B1"),
        pytest.param(X[:, :2], "mse", 2, id="mse_same"),
        pytest.param(Y.astype(np.float32), "mse", 1, id="mse_B_vs_B1"),
        pytest.param(ONE_HOT, squared_error, 3, id="custom"),
    ],
)
def test_labels_that_fit_train(y, loss, units):
    activation = "softmax" if loss == "categorical_crossentropy" else None
    history = fit(y, loss, units=units, activation=activation)
    assert np.isfinite(history.history["loss"][0])


def test_check_reads_no_data_for_integer_labels_and_leaves_the_model_alone():
    inputs = keras.Input((4,))
    normed = keras.layers.BatchNormalization()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(normed))
    before = [w.numpy().copy() for w in model.weights]

    def never_read(x, y):
        tf.debugging.Assert(False, ["read"])  # fails if an element is produced
        return x, y

    ds = batches(Y, x=X + 5.0).map(never_read)
    data.check(ds, model, "sparse_categorical_crossentropy")
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights, strict=True))


def test_check_accepts_a_pipeline_and_a_subclassed_model():
    class Head(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    ds = data.pipeline(data.from_arrays(X, Y.astype(np.float32)), batch_size=4, training=False)
    with pytest.raises(ValueError, match=r"labels \(B,\) and model outputs \(B, 3\)"):
        data.check(ds, Head(), "mse")
    data.check(ds, Head(), "sparse_categorical_crossentropy")


@pytest.mark.parametrize("metrics", ["accuracy", keras.metrics.SparseCategoricalAccuracy(), None])
def test_metrics_alone_or_none_work_like_a_list(metrics):
    trainer = tfaccel.Trainer(
        dense(3),
        loss="sparse_categorical_crossentropy",
        metrics=metrics,
        strategy=tf.distribute.get_strategy(),
    )
    logs = trainer.fit(batches(Y), epochs=1, verbose=0).history
    assert ("accuracy" in logs or "sparse_categorical_accuracy" in logs) == (metrics is not None)
