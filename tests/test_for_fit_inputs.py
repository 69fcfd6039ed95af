"""tfaccel.methods.for_fit takes what model.fit takes (arrays, batch_size, sample_weight,
validation_split, shuffle), keeps sparse metrics working when a method makes labels one-hot,
and reads the job's kind from the model: checked against model.fit and hand-made numbers."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import methods

X = np.arange(40, dtype="float64").reshape(10, 4) / 40.0  # float64: cast as model.fit does
Y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0], dtype="int64")


def dense_model(seed=3, inputs=(4,)):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(inputs), keras.layers.Dense(3, activation="softmax")])


def plan_of(x=X, y=Y, chosen=None, **kwargs):
    kwargs.setdefault("loss", "sparse_categorical_crossentropy")
    kwargs.setdefault("optimizer", keras.optimizers.SGD(0.5))
    return methods.for_fit(chosen, dense_model(), x, y, epochs=kwargs.pop("epochs", 1), **kwargs)


def rows(data):
    return [tuple(np.asarray(part) for part in batch) for batch in data]


# -- arrays, batch_size, validation_split -------------------------------------------------


def test_arrays_split_and_batch_as_model_fit_holds_them_out():
    plan = plan_of(batch_size=4, validation_split=0.2, shuffle=False)
    train = rows(plan.dataset)
    assert [len(b[0]) for b in train] == [4, 4]  # the first 8 examples, in order
    np.testing.assert_allclose(np.concatenate([b[0] for b in train]), X[:8], rtol=1e-6)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in train]), Y[:8])
    held = rows(plan.validation_data)  # floor(10 * 0.8) = 8: the last two examples
    assert len(held) == 1
    np.testing.assert_allclose(held[0][0], X[8:], rtol=1e-6)
    np.testing.assert_array_equal(held[0][1], Y[8:])
    assert train[0][0].dtype == np.float32
    assert plan.job.batch_size == 4 and plan.job.steps_per_epoch == 2


def test_arrays_train_to_the_same_weights_and_val_loss_as_model_fit():
    keras_model = dense_model()
    keras_model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
    want = keras_model.fit(X, Y, batch_size=3, validation_split=0.3, shuffle=False, verbose=0)
    model = dense_model()
    plan = methods.for_fit(
        None,
        model,
        X,
        Y,
        epochs=1,
        loss="sparse_categorical_crossentropy",
        batch_size=3,
        validation_split=0.3,
        shuffle=False,
    )
    model.compile(keras.optimizers.SGD(0.5), plan.loss)
    got = model.fit(plan.dataset, validation_data=plan.validation_data, verbose=0)
    for a, b in zip(model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.history["val_loss"], want.history["val_loss"], rtol=1e-5)


def test_batch_size_defaults_to_keras_32_and_shuffle_reorders_each_epoch():
    x = np.arange(80, dtype="float32").reshape(40, 2)
    plan = methods.for_fit(
        None,
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        x,
        np.zeros(40, "int32"),
        epochs=1,
        loss="sparse_categorical_crossentropy",
        seed=7,
    )
    first, second = rows(plan.dataset), rows(plan.dataset)
    assert [len(b[0]) for b in first] == [32, 8]
    seen = np.sort(np.concatenate([b[0][:, 0] for b in first]))
    np.testing.assert_array_equal(seen, x[:, 0])  # every example once an epoch
    assert not np.array_equal(first[0][0], second[0][0])


def test_a_zero_sample_weight_does_not_move_the_weights():
    keras_model = dense_model()
    keras_model.compile(
        keras.optimizers.SGD(0.5), keras.losses.CategoricalCrossentropy(label_smoothing=0.1)
    )
    keras_model.fit(X[:1], tf.one_hot(Y[:1], 3), batch_size=1, verbose=0)  # example 0 only
    model = dense_model()
    plan = methods.for_fit(
        methods.LabelSmoothing(0.1),
        model,
        X[:2],
        Y[:2],
        epochs=1,
        batch_size=1,
        shuffle=False,
        sample_weight=np.array([1.0, 0.0]),
        loss="sparse_categorical_crossentropy",
    )
    assert plan.one_hot and len(plan.dataset.element_spec) == 3
    model.compile(keras.optimizers.SGD(0.5), plan.loss)
    model.fit(plan.dataset, callbacks=plan.callbacks, verbose=0)  # example 1 weighs 0
    for a, b in zip(model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_dataset_still_works_as_before():
    data = tf.data.Dataset.from_tensor_slices((X.astype("float32"), Y)).batch(5)
    plan = plan_of(data, None)
    assert plan.validation_data is None and plan.job.batch_size == 5
    assert plan.job.steps_per_epoch == 2


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"y": None}, ValueError, "without y"),
        ({"validation_split": 1.0}, ValueError, r"validation_split must be a fraction in \[0, 1\)"),
        ({"validation_split": -0.1}, ValueError, "validation_split must be a fraction"),
        ({"validation_split": 0.95}, ValueError, "leaves no training example"),
        (
            {"sample_weight": np.ones(9)},
            ValueError,
            "sample_weight holds 9 examples where x holds 10",
        ),
        ({"y": Y[:7]}, ValueError, "y holds 7 examples where x holds 10"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive int"),
        ({"shuffle": "batch"}, ValueError, "shuffle must be True or False"),
        ({"class_weight": {0: 1.0}}, TypeError, r"unexpected keyword arguments \['class_weight'\]"),
        ({"x": iter([1, 2])}, TypeError, "for_fit takes x as model.fit does"),
    ],
)
def test_bad_inputs_are_refused_with_the_way_out(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_of(**{"x": X, "y": Y, **kwargs})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"validation_split": 0.2}, "validation_split with a dataset"),
        ({"y": Y}, "y with a dataset"),
        ({"sample_weight": np.ones(10)}, "sample_weight with a dataset"),
    ],
)
def test_a_dataset_refuses_what_model_fit_refuses(kwargs, match):
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(5)
    with pytest.raises(ValueError, match=match):
        plan_of(**{"x": data, "y": None, **kwargs})


# -- sparse metrics when the labels are made one-hot ------------------------------------


def test_sparse_categorical_accuracy_keeps_its_name_after_label_smoothing():
    model = dense_model()
    plan = methods.for_fit(
        methods.LabelSmoothing(0.1),
        model,
        X,
        Y,
        epochs=1,
        batch_size=4,
        validation_split=0.4,
        loss="sparse_categorical_crossentropy",
    )
    assert plan.one_hot
    metrics = plan.metrics(["sparse_categorical_accuracy", "accuracy"])
    assert isinstance(metrics[0], keras.metrics.CategoricalAccuracy) and metrics[1] == "accuracy"
    model.compile(plan.optimizer, plan.loss, metrics=metrics)
    history = model.fit(
        plan.dataset, validation_data=plan.validation_data, callbacks=plan.callbacks, verbose=0
    )
    want = np.mean(np.argmax(model.predict(X[6:], verbose=0), axis=1) == Y[6:])
    assert history.history["val_sparse_categorical_accuracy"] == [pytest.approx(want)]
    assert "sparse_categorical_accuracy" in history.history


def test_metric_objects_functions_and_outputs_map_to_their_categorical_twins():
    plan = plan_of(chosen=methods.LabelSmoothing(0.1))
    top2 = keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")
    mapped = plan.metrics({"out": [top2, keras.metrics.sparse_categorical_accuracy, "mae"]})
    twin, function, mae = mapped["out"]
    assert isinstance(twin, keras.metrics.TopKCategoricalAccuracy) and twin.name == "top2"
    assert twin.get_config()["k"] == 2
    assert isinstance(function, keras.metrics.CategoricalAccuracy)
    assert function.name == "sparse_categorical_accuracy" and mae == "mae"
    assert plan_of().metrics(["sparse_categorical_accuracy"]) == ["sparse_categorical_accuracy"]
    ce = methods.fitting.categorical_metric(
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="ce")
    )
    assert isinstance(ce, keras.metrics.CategoricalCrossentropy) and ce.name == "ce"
    np.testing.assert_allclose(  # the same number on one-hot labels as the sparse one
        ce(tf.one_hot([2], 3), tf.constant([[0.1, 0.2, 1.0]])),
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True)(
            tf.constant([2]), tf.constant([[0.1, 0.2, 1.0]])
        ),
        rtol=1e-6,
    )


def test_sparse_metrics_compiled_as_given_are_refused_before_step_1():
    model = dense_model()
    plan = methods.for_fit(
        methods.LabelSmoothing(0.1),
        model,
        X,
        Y,
        epochs=1,
        loss="sparse_categorical_crossentropy",
    )
    names = [name for name, _ in plan.table()]
    assert names[names.index("labels") + 1] == "metrics"
    assert "metrics=plan.metrics([...])" in plan.describe()
    assert "metrics" not in [name for name, _ in plan_of().table()]  # labels kept sparse
    model.compile(plan.optimizer, plan.loss, metrics=["sparse_categorical_accuracy"])
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"metrics=plan.metrics\(\[...\]\)"):
        model.fit(plan.dataset, callbacks=plan.callbacks, verbose=0)
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    model.compile(plan.optimizer, keras.losses.SparseCategoricalCrossentropy())
    with pytest.raises(ValueError, match="compile with loss=plan.loss"):
        model.fit(plan.dataset, callbacks=plan.callbacks, verbose=0)


# -- the job's kind from the model -------------------------------------------------------


def conv1d_model():
    return keras.Sequential(
        [
            keras.Input((20, 1)),
            keras.layers.Conv1D(4, 3),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )


def gru_model():
    return keras.Sequential([keras.Input((20, 1)), keras.layers.GRU(4), keras.layers.Dense(2)])


def mha_model():
    inputs = keras.Input((20, 4))
    attended = keras.layers.MultiHeadAttention(2, 4)(inputs, inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(attended)
    return keras.Model(inputs, keras.layers.Dense(2)(pooled))


class Block(keras.layers.Layer):  # a custom layer holding attention, as keras.io's
    def __init__(self):
        super().__init__()
        self.attention = keras.layers.MultiHeadAttention(2, 4)

    def call(self, x):
        return self.attention(x, x)


def test_kind_of_reads_the_layers_and_falls_back_on_the_rank():
    sequence_spec = tf.TensorSpec((None, 20, 1))
    assert methods.kind_of(sequence_spec, conv1d_model()) == "image"  # a convnet, not a GRU job
    assert methods.kind_of(sequence_spec, gru_model()) == "sequence"
    assert methods.kind_of(sequence_spec, mha_model()) == "sequence"
    flat = keras.Sequential([keras.Input((20, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    assert methods.kind_of(sequence_spec, flat) == "sequence"  # dense: the rank decides
    assert methods.kind_of(tf.TensorSpec((None, 6)), dense_model(inputs=(6,))) == "tabular"
    nested = keras.Sequential([keras.Input((20, 4)), Block(), keras.layers.Dense(2)])
    outer = keras.Sequential([keras.Input((20, 4)), nested])
    assert methods.kind_of(tf.TensorSpec((None, 6)), outer) == "sequence"
    mixed = keras.Sequential(
        [keras.Input((20, 1)), keras.layers.Conv1D(4, 3), keras.layers.LSTM(4)]
    )
    assert methods.kind_of(sequence_spec, mixed) == "sequence"  # a recurrence first


def fast_plan(model, **kwargs):
    x = np.random.default_rng(0).normal(size=(64, 20, 1)).astype("float32")
    with warnings.catch_warnings():  # what "fast" drops on so small a job is not checked here
        warnings.simplefilter("ignore")
        return methods.for_fit(
            "fast",
            model,
            x,
            np.arange(64) % 2,
            epochs=2,
            loss="sparse_categorical_crossentropy",
            **kwargs,
        )


def test_fast_on_a_1d_convnet_says_no_stack_was_measured_on_it():
    conv = fast_plan(conv1d_model())
    assert "image jobs" in conv.chosen
    assert "no stack was measured on 1-D convnets" in conv.chosen
    assert "no stack was measured on 1-D convnets" in conv.describe()
    gru = fast_plan(gru_model())
    assert "sequence jobs" in gru.chosen and "measured on" not in gru.chosen
    given = fast_plan(conv1d_model(), kind="sequence")
    assert "sequence jobs" in given.chosen and "1-D" not in given.chosen


def test_fast_warms_a_long_attention_job_up_over_a_quarter_of_its_first_epoch():
    """From 200 steps an epoch: the sequence stack, its warm-up over 25 % of the first
    epoch for an attention model (all of it for a GRU), and the row says so."""
    x = np.zeros((6_400, 20, 1), "float32")  # 200 steps of 32
    inputs = keras.Input((20, 1))
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.MultiHeadAttention(2, 4)(inputs, inputs)
    )
    warmups = {}
    for name, model in (("attention", keras.Model(inputs, keras.layers.Dense(2)(pooled))),
                        ("gru", gru_model())):  # fmt: skip
        plan = methods.for_fit(
            "fast", model, x, np.arange(6_400) % 2, batch_size=32, epochs=2,
            loss="sparse_categorical_crossentropy",
        )  # fmt: skip
        (plateau,) = [m for m in plan.methods if isinstance(m, methods.Plateau)]
        warmups[name] = (plateau.warmup, plan.chosen)
    assert warmups["attention"][0] == methods.composition.ATTENTION_WARMUP == 0.25
    assert "attention: the warm-up over 25% of the first epoch" in warmups["attention"][1]
    assert warmups["gru"][0] == 1.0 and "attention" not in warmups["gru"][1]


def test_fast_on_an_attention_model_names_the_choice_job_it_was_measured_on():
    inputs = keras.Input((20, 1))
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.MultiHeadAttention(2, 4)(inputs, inputs)
    )
    attended = fast_plan(keras.Model(inputs, keras.layers.Dense(2)(pooled)))
    assert "sequence jobs" in attended.chosen
    assert "cifar_shaped_attention" in attended.chosen and "no stack" not in attended.chosen


def test_a_sparse_metric_with_ignore_class_is_refused_not_dropped():
    given = keras.metrics.SparseCategoricalCrossentropy(ignore_class=0, name="ce")
    with pytest.raises(ValueError, match=r"'ce' cannot keep ignore_class=0.*sample weight of 0"):
        methods.fitting.categorical_metric(given)
    kept = methods.fitting.categorical_metric(keras.metrics.SparseCategoricalCrossentropy())
    assert isinstance(kept, keras.metrics.CategoricalCrossentropy)
