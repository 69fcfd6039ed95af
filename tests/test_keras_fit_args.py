"""A compiled Keras model and `model.fit`'s arguments work in the Trainer as in `model.fit`.

Each comparison trains the same model (same seed) with `model.fit` and with the Trainer,
both without shuffling, and compares weights and logs. On 2 replicas the reference runs
under the same MirroredStrategy.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import data
from tfaccel.data.assembly.feed import Feed
from tfaccel.train.setup import remainder

RNG = np.random.default_rng(0)
X = RNG.normal(size=(70, 6)).astype("float32")
Y = RNG.integers(0, 3, size=70).astype("int32")
W = RNG.uniform(0.2, 2.0, size=70).astype("float32")


def build(compile_kwargs=None, seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    kwargs = {
        "optimizer": keras.optimizers.SGD(0.1),
        "loss": "sparse_categorical_crossentropy",
        "metrics": ["accuracy"],
    }
    model.compile(**{**kwargs, **(compile_kwargs or {})})
    return model


def gap(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b, strict=True))


def both(strategy, fit_kwargs, compile_kwargs=None):
    """(model.fit's history and weights, the Trainer's) on the same compiled model."""
    with strategy.scope():
        reference = build(compile_kwargs)
    expected = reference.fit(X, Y, verbose=0, shuffle=False, **fit_kwargs)
    with strategy.scope():
        ours = tfaccel.Trainer(build(compile_kwargs), strategy=strategy)
    history = ours.fit(X, Y, verbose=0, shuffle=False, **fit_kwargs)
    return expected, reference.get_weights(), history, ours


def assert_same(expected, history, tol=1e-5):
    assert set(history.history) == set(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=tol, err_msg=key)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize(
    "fit_kwargs",
    [
        {"batch_size": 16, "epochs": 2, "validation_split": 0.2},
        {"batch_size": 16, "epochs": 2, "class_weight": {0: 2.0, 1: 0.5}},
        {"batch_size": 16, "epochs": 2, "sample_weight": W, "validation_data": (X[:20], Y[:20])},
        {"epochs": 1},  # batch_size defaults to 32: 32, 32, 6
        {"batch_size": 10, "epochs": 3, "initial_epoch": 1},
    ],
    ids=["validation_split", "class_weight", "sample_weight", "default_batch", "initial_epoch"],
)
def test_trainer_fit_on_arrays_equals_model_fit(fit_kwargs, replicas, mirrored):
    strategy = mirrored if replicas == 2 else tf.distribute.get_strategy()
    expected, weights, history, ours = both(strategy, fit_kwargs)
    assert isinstance(history, keras.callbacks.History)
    assert history.epoch == expected.epoch
    assert gap(weights, ours.model.get_weights()) < 1e-5
    assert_same(expected, history)


def test_weighted_metrics_and_loss_weights_follow_compile(mirrored):
    compile_kwargs = {"weighted_metrics": ["accuracy"], "metrics": None, "loss_weights": 2.5}
    fit_kwargs = {"batch_size": 16, "epochs": 2, "sample_weight": W}
    expected, weights, history, ours = both(mirrored, fit_kwargs, compile_kwargs)
    assert ours.loss.weight == 2.5
    assert gap(weights, ours.model.get_weights()) < 1e-5
    assert_same(expected, history)


def test_unweighted_metrics_ignore_class_weights():
    compile_kwargs = {
        "metrics": ["accuracy"],
        "weighted_metrics": ["sparse_categorical_crossentropy"],
    }
    fit_kwargs = {"batch_size": 16, "epochs": 1, "class_weight": {0: 3.0}}
    expected, _, history, _ = both(tf.distribute.get_strategy(), fit_kwargs, compile_kwargs)
    assert_same(expected, history)


def test_dict_of_arrays_for_named_inputs():
    def named():
        keras.utils.set_random_seed(2)
        a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
        joined = keras.layers.Concatenate()([a, b])
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(3)(joined))
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(keras.optimizers.SGD(0.1), loss)
        return model

    x = {"a": X[:, :4], "b": X[:, 4:]}
    reference = named()
    reference.fit(x, Y, batch_size=20, epochs=2, shuffle=False, verbose=0)
    ours = tfaccel.Trainer(named(), strategy=tf.distribute.get_strategy())
    ours.fit(x, Y, batch_size=20, epochs=2, shuffle=False, verbose=0)
    assert gap(reference.get_weights(), ours.model.get_weights()) < 1e-5
    want = reference.evaluate(x, Y, verbose=0, return_dict=True)
    assert ours.evaluate(x, Y) == pytest.approx(want, rel=1e-5)


def test_validation_split_takes_the_last_examples_before_shuffling():
    ours = tfaccel.Trainer(build(), strategy=tf.distribute.get_strategy())
    history = ours.fit(X, Y, batch_size=16, validation_split=0.3, epochs=1, verbose=0)
    tail = ours.evaluate(X[49:], Y[49:])  # floor(70 * 0.7) = 49 training examples
    assert history.history["val_loss"][0] == pytest.approx(tail["loss"], rel=1e-5)


def test_shuffle_follows_keras_random_seed():
    def run():
        keras.utils.set_random_seed(5)
        ours = tfaccel.Trainer(build(), strategy=tf.distribute.get_strategy())
        ours.fit(X, Y, batch_size=8, epochs=2, verbose=0)
        return ours.model.get_weights()

    unshuffled = tfaccel.Trainer(build(), strategy=tf.distribute.get_strategy())
    unshuffled.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    first, second = run(), run()
    assert gap(first, second) == 0.0
    assert gap(first, unshuffled.model.get_weights()) > 1e-4


# -- the compiled model ------------------------------------------------------------------


def test_explicit_arguments_win_over_compile():
    ours = tfaccel.Trainer(
        build(),
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[],
        strategy=tf.distribute.get_strategy(),
    )
    assert type(ours.optimizer).__name__ == "Adam"
    assert ours.metrics == []
    ours = tfaccel.Trainer(build(), strategy=tf.distribute.get_strategy())
    assert type(ours.optimizer).__name__ == "SGD"
    assert [m.name for m in ours.metrics] == ["accuracy"]
    assert ours.loss.name == "sparse_categorical_crossentropy"


def test_model_compiled_outside_the_scope_is_copied_in_and_weights_come_back(mirrored):
    user = build({"metrics": ["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)]})
    before = user.get_weights()
    ours = tfaccel.Trainer(user, strategy=mirrored)
    assert ours.model is not user and ours.source_model is user
    assert gap(before, ours.model.get_weights()) == 0.0  # same starting weights
    assert ours.model.compiled
    assert all(mirrored.extended.variable_created_in_scope(v.value) for v in ours.model.variables)
    ours.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    assert gap(user.get_weights(), ours.model.get_weights()) == 0.0
    assert gap(user.get_weights(), before) > 1e-4
    assert [m.name for m in ours.metrics] == ["accuracy", "sparse_top_k_categorical_accuracy"]


def test_subclassed_model_outside_the_scope_names_the_fix(mirrored):
    class Net(keras.Model):
        def __init__(self, units):  # no get_config: cannot be cloned
            super().__init__()
            self.dense = keras.layers.Dense(units)

        def call(self, x):
            return self.dense(x)

    net = Net(3)
    net(X[:2])
    net.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(
        ValueError, match=r"(?s)outside the Trainer's strategy.*get_config.*strategy.scope\(\)"
    ):
        tfaccel.Trainer(net, strategy=mirrored)


def test_no_loss_anywhere_is_an_error():
    inputs = keras.Input((6,))
    plain = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    with pytest.raises(ValueError, match=r"No loss: pass loss=.*model.compile"):
        tfaccel.Trainer(plain, strategy=tf.distribute.get_strategy())
    plain.compile("sgd")
    with pytest.raises(ValueError, match="compiled without a loss"):
        tfaccel.Trainer(plain, strategy=tf.distribute.get_strategy())


# -- the partial last batch (issue 27, point 4) -------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2])
def test_partial_batch_kept_by_default_equals_model_fit(replicas, mirrored):
    strategy = mirrored if replicas == 2 else tf.distribute.get_strategy()
    train = data.pipeline(
        data.from_arrays(X, Y),
        batch_size=16,
        training=True,
        shuffle_buffer=None,
        deterministic=True,
        strategy=strategy,
    )
    assert data.plan_of(train).step("batch").settings["drop_remainder"] is False
    with strategy.scope():
        reference = build()
    expected = reference.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    ours = tfaccel.Trainer(build, strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tfaccel.DroppedExamplesWarning)  # nothing dropped
        history = ours.fit(train, epochs=2, verbose=0)
    assert ours.settings["drop_remainder"] is False
    assert gap(reference.get_weights(), ours.model.get_weights()) < 1e-5
    assert_same(expected, history)


def test_dropped_examples_are_counted_in_one_warning(mirrored):
    train = data.pipeline(
        data.from_arrays(X, Y), batch_size=16, training=True, seed=0, strategy=mirrored,
        drop_remainder=True,
    )  # fmt: skip
    ours = tfaccel.Trainer(build, strategy=mirrored)
    with pytest.warns(tfaccel.DroppedExamplesWarning) as caught:
        ours.fit(train, epochs=2, verbose=0)
    dropped = [w for w in caught if w.category is tfaccel.DroppedExamplesWarning]
    assert len(dropped) == 1
    assert "6 of 70 training examples (8.6%) are dropped every epoch" in str(dropped[0].message)
    assert "drop_remainder=False" in str(dropped[0].message)
    assert ours.settings["drop_remainder"] == "True (6 of 70 dropped)"
    assert int(ours.step.numpy()) == 2 * 4


def test_plain_dataset_with_drop_remainder_is_counted_too():
    batched = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32, drop_remainder=True)
    ours = tfaccel.Trainer(build, strategy=tf.distribute.get_strategy())
    with pytest.warns(tfaccel.DroppedExamplesWarning, match="6 of 70 training examples"):
        ours.fit(batched, verbose=0)


def test_xla_drops_and_says_why():
    train = data.pipeline(data.from_arrays(X, Y), batch_size=16, training=True, jit_compile=True)
    assert train.element_spec[0].shape[0] == 16
    with pytest.warns(tfaccel.DroppedExamplesWarning, match=r"6 of 70.*XLA \(jit_compile=True\)"):
        remainder.warn_if_dropped(Feed(train, tf.distribute.get_strategy()), jit_compile=True)
