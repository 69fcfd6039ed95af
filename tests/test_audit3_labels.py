"""The label methods after the third audit (issue 69, items 1, 2, 9): binary labels mixed
in their own shape, every setting of the user's loss kept or refused by name, sparse
sequence labels smoothed per position, clear errors for a method class and for raw
sparse validation data."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import methods
from tfaccel.methods import labels

RNG = np.random.default_rng(0)
X = RNG.normal(size=(512, 4)).astype("float32")
BINARY = (X[:, 0] + X[:, 1] > 0).astype("int32")  # linearly separable, balanced
CLASSES = RNG.integers(0, 3, size=512).astype("int32")
SEQ_X = RNG.normal(size=(64, 5, 4)).astype("float32")
SEQ_Y = RNG.integers(0, 3, size=(64, 5)).astype("int32")


def dataset(x, y, batch=32):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def sigmoid_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])


def softmax_model(shape=(4,)):
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input(shape), keras.layers.Dense(3, activation="softmax")])


def trainer(build, loss, chosen, optimizer=None, **kwargs):
    return tfaccel.Trainer(
        build,
        optimizer=optimizer or keras.optimizers.Adam(0.05),
        loss=loss,
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
        jit_compile=False,
        methods=chosen,
        **kwargs,
    )


# -- 1: binary labels ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4,), (4, 1)])
def test_mixup_mixes_binary_labels_as_floats_in_their_own_shape(shape):
    x = tf.constant([[1.0], [2.0], [3.0], [4.0]])
    y = tf.reshape(tf.constant([1, 0, 0, 1]), shape)
    t = {
        "mix_weight": tf.constant([0.7, 0.25, 0.5, 0.9]),
        "permutation_order": tf.constant([1, 0, 3, 2]),
    }
    mixed_x, mixed_y = methods.MixUp().mix(x, y, t)
    want = np.array([0.7 * 1 + 0.3 * 0, 0.25 * 0 + 0.75 * 1, 0.5 * 0 + 0.5 * 1, 0.9 * 1 + 0.1 * 0])
    assert mixed_y.shape == shape and mixed_y.dtype == tf.float32
    np.testing.assert_allclose(np.reshape(mixed_y, -1), want, atol=1e-6)
    np.testing.assert_allclose(mixed_x[:, 0], [1.3, 1.25, 3.5, 3.9], atol=1e-6)


def test_cutmix_mixes_binary_labels_by_the_kept_share():
    x = tf.stack([tf.zeros((4, 4, 1)), tf.ones((4, 4, 1))])
    inside = np.zeros((2, 4, 4), bool)
    inside[0, :2, :2] = True  # example 0 gets 4 of 16 pixels from example 1
    t = methods.CutMix.box_transformation(inside, [1, 0])
    _, mixed_y = methods.CutMix().mix(x, tf.constant([0, 1]), t)
    assert mixed_y.shape == (2,)
    np.testing.assert_allclose(mixed_y, [0.25, 1.0], atol=1e-6)


def test_mixup_through_for_fit_keeps_a_binary_jobs_labels_and_loss():
    loss = keras.losses.BinaryCrossentropy(reduction="sum", name="bce")
    plan = methods.for_fit(
        [methods.MixUp(0.4)], sigmoid_model(), dataset(X, BINARY), epochs=1, loss=loss
    )
    assert not plan.one_hot and not any(m.name == "one-hot labels" for m in plan.maps)
    for _, y in plan.dataset.take(2):
        assert y.shape == (32,) and y.dtype == tf.float32
        assert float(tf.reduce_min(y)) >= 0.0 and float(tf.reduce_max(y)) <= 1.0
    assert type(plan.loss) is keras.losses.BinaryCrossentropy
    assert plan.loss.reduction == "sum" and plan.loss.name == "bce"


@pytest.mark.parametrize("path", ["for_fit", "trainer"])
def test_a_binary_job_with_mixup_learns(path):
    """Mixed labels of shape (B, B) broadcast against (B, 1) outputs trained each output
    towards the batch's mean label; mixed in their own shape, the boundary is learnt."""
    train = dataset(X, BINARY)
    if path == "for_fit":
        model = sigmoid_model()
        plan = methods.for_fit(
            [methods.MixUp(0.2)],
            model,
            train,
            epochs=3,
            loss="binary_crossentropy",
            optimizer=keras.optimizers.Adam(0.05),
        )
        model.compile(plan.optimizer, plan.loss, metrics=["accuracy"])
        model.fit(plan.dataset, epochs=3, verbose=0)
        accuracy = model.evaluate(X, BINARY, verbose=0, return_dict=True)["accuracy"]
    else:
        ours = trainer(
            sigmoid_model, "binary_crossentropy", [methods.MixUp(0.2)], metrics=["accuracy"]
        )
        ours.fit(train, epochs=3, verbose=0)
        accuracy = ours.evaluate(dataset(X, BINARY, 64))["accuracy"]
    assert accuracy > 0.9


# -- 2: the user's loss, every setting kept ------------------------------------------------


def _probabilities(shape=(6, 3)):
    return tf.nn.softmax(tf.constant(RNG.normal(size=shape), tf.float32))


@pytest.mark.parametrize("reduction", ["sum", "mean", "sum_over_batch_size", None])
@pytest.mark.parametrize("from_logits", [False, True])
def test_the_wrapped_sparse_loss_with_no_smoothing_is_the_users_loss(reduction, from_logits):
    given = keras.losses.SparseCategoricalCrossentropy(
        from_logits=from_logits, reduction=reduction, name="mine"
    )
    wrapped = labels.soft_target_loss(given, 0.0)
    y = tf.constant([0, 2, 1, 1, 0, 2])
    p = _probabilities()
    out = tf.math.log(p) if from_logits else p
    np.testing.assert_allclose(wrapped(tf.one_hot(y, 3), out), given(y, out), rtol=1e-6)
    mine = labels.settings(given)
    del mine["ignore_class"]
    assert labels.settings(wrapped) == {**mine, "label_smoothing": 0.0}


@pytest.mark.parametrize(
    "given",
    [
        keras.losses.CategoricalCrossentropy(reduction="sum", axis=-1, name="cce", dtype="float64"),
        keras.losses.BinaryCrossentropy(from_logits=True, reduction="mean", label_smoothing=0.05),
        keras.losses.CategoricalFocalCrossentropy(alpha=0.5, gamma=1.0, reduction=None),
        keras.losses.BinaryFocalCrossentropy(apply_class_balancing=True, gamma=3.0),
    ],
    ids=["categorical", "binary", "categorical_focal", "binary_focal"],
)
def test_every_setting_of_the_users_loss_is_kept(given):
    wrapped = labels.soft_target_loss(given, 0.0)
    assert type(wrapped) is type(given)
    assert labels.settings(wrapped) == labels.settings(given)
    y = tf.one_hot([0, 2, 1, 1, 0, 2], 3)
    p = _probabilities()
    np.testing.assert_allclose(wrapped(y, p), given(y, p), rtol=1e-6)
    smoothed = labels.soft_target_loss(given, 0.1)
    assert labels.settings(smoothed) == {**labels.settings(given), "label_smoothing": 0.1}


def test_label_smoothing_keeps_a_sum_reduction_in_model_fit():
    """The audit's case: reduction="sum" became a batch mean (epoch loss 33.3 -> 1.22)."""
    given = keras.losses.SparseCategoricalCrossentropy(reduction="sum")
    model = softmax_model()
    plan = methods.for_fit(
        [methods.LabelSmoothing(0.1)], model, dataset(X, CLASSES), epochs=1, loss=given
    )
    assert plan.loss.reduction == "sum" and plan.loss.name == given.name
    p = model.predict(X[:32], verbose=0)
    target = 0.9 * tf.one_hot(CLASSES[:32], 3) + 0.1 / 3
    want = -np.sum(target * np.log(p))
    assert float(plan.loss(tf.one_hot(CLASSES[:32], 3), p)) == pytest.approx(want, rel=1e-5)
    model.compile(plan.optimizer, plan.loss)
    loss = model.fit(plan.dataset, epochs=1, verbose=0).history["loss"][0]
    assert loss > 20  # a sum over 32 examples of ~1.1 each, not their mean


def test_the_trainer_keeps_a_sum_reduction_under_label_smoothing():
    def fresh():
        return keras.losses.SparseCategoricalCrossentropy(reduction="sum")

    reference = softmax_model()
    plan = methods.for_fit(
        [methods.LabelSmoothing(0.1)],
        reference,
        dataset(X, CLASSES),
        epochs=1,
        loss=fresh(),
        optimizer=keras.optimizers.SGD(0.001),
    )
    reference.compile(plan.optimizer, plan.loss)
    reference.fit(plan.dataset, epochs=1, verbose=0)
    ours = trainer(
        softmax_model, fresh(), [methods.LabelSmoothing(0.1)], keras.optimizers.SGD(0.001)
    )
    ours.fit(dataset(X, CLASSES), epochs=1, verbose=0)
    assert ours.loss.sums
    for a, b in zip(reference.get_weights(), ours.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_setting_that_cannot_be_kept_is_refused_by_name_before_step_one():
    given = keras.losses.SparseCategoricalCrossentropy(ignore_class=0)
    optimizer = keras.optimizers.Adam()
    with pytest.raises(ValueError, match=r"LabelSmoothing cannot keep ignore_class=0") as error:
        methods.for_fit(
            [methods.LabelSmoothing(0.1)],
            softmax_model(),
            dataset(X, CLASSES),
            epochs=1,
            loss=given,
            optimizer=optimizer,
        )
    assert "sample weight of 0" in str(error.value)
    assert not optimizer.built
    ours = trainer(softmax_model, given, [methods.MixUp(0.2)])
    with pytest.raises(ValueError, match=r"MixUp cannot keep ignore_class=0"):
        ours.fit(dataset(X, CLASSES), epochs=1, verbose=0)
    assert int(ours.step) == 0


# -- 9: a method class, sequence labels, raw validation data -------------------------------


@pytest.mark.parametrize("given", [methods.MixUp, [methods.OneCycle(), methods.MixUp]])
def test_a_method_class_is_refused_with_the_call_to_write(given):
    want = r"the class methods.MixUp, not a method: write methods.MixUp\(\)"
    with pytest.raises(TypeError, match=want):
        methods.for_fit(
            given,
            softmax_model(),
            dataset(X, CLASSES),
            epochs=1,
            loss="sparse_categorical_crossentropy",
        )
    with pytest.raises(TypeError, match=want):
        trainer(softmax_model, "sparse_categorical_crossentropy", given)


def test_a_methods_argument_that_is_no_list_is_refused():
    with pytest.raises(TypeError, match=r"methods=3: use 'fast', 'none', a method or a list"):
        methods.resolve(3)


@pytest.mark.parametrize("shape", [(64, 5), (64, 5, 1)])
def test_label_smoothing_on_sparse_sequence_labels_smooths_each_position(shape):
    y = SEQ_Y.reshape(shape)
    model = softmax_model((5, 4))
    plan = methods.for_fit(
        [methods.LabelSmoothing(0.1)],
        model,
        dataset(SEQ_X, y, 16),
        epochs=1,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.SGD(0.1),
    )
    x, targets = next(iter(plan.dataset))
    np.testing.assert_array_equal(targets, tf.one_hot(SEQ_Y[:16], 3))
    p = model.predict(x, verbose=0)
    want = -np.mean(np.sum((0.9 * targets + 0.1 / 3) * np.log(p), axis=-1))
    assert float(plan.loss(targets, p)) == pytest.approx(want, rel=1e-5)
    model.compile(plan.optimizer, plan.loss)
    model.fit(plan.dataset, epochs=1, verbose=0)
    ours = trainer(
        lambda: softmax_model((5, 4)),
        "sparse_categorical_crossentropy",
        [methods.LabelSmoothing(0.1)],
        keras.optimizers.SGD(0.1),
    )
    ours.fit(dataset(SEQ_X, y, 16), epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), ours.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_mixup_mixes_sequence_labels_per_example():
    y = tf.one_hot([[0, 1], [2, 2]], 3)  # (B=2, T=2, C=3)
    t = {"mix_weight": tf.constant([0.75, 0.5]), "permutation_order": tf.constant([1, 0])}
    _, mixed = methods.MixUp().mix(tf.zeros((2, 2, 1)), y, t)
    want = [
        [[0.75, 0.0, 0.25], [0.0, 0.75, 0.25]],
        [[0.5, 0.0, 0.5], [0.0, 0.5, 0.5]],
    ]
    np.testing.assert_allclose(mixed, want, atol=1e-6)


def test_sparse_labels_that_do_not_fit_the_outputs_positions_are_refused():
    with pytest.raises(ValueError, match=r"one class id per output position") as error:
        methods.for_fit(
            [methods.LabelSmoothing(0.1)],
            softmax_model(),  # outputs (B, 3): one id per example
            dataset(SEQ_X[:, :, 0], SEQ_Y, 16),
            epochs=1,
            loss="sparse_categorical_crossentropy",
        )
    assert "labels of shape ('B',)" in str(error.value)
    assert "got ('B', 5)" in str(error.value)


def test_raw_sparse_validation_data_is_refused_naming_evaluation_data():
    model = softmax_model()
    train, val = dataset(X[:256], CLASSES[:256]), dataset(X[256:], CLASSES[256:])
    plan = methods.for_fit(
        [methods.LabelSmoothing(0.1)],
        model,
        train,
        epochs=1,
        loss="sparse_categorical_crossentropy",
    )
    assert ("labels", methods.base.ONE_HOT_NOTE) in plan.table()
    assert "plan.evaluation_data(val)" in plan.describe()
    model.compile(plan.optimizer, plan.loss, metrics=["accuracy"])
    with pytest.raises(ValueError, match=r"validation_data=plan.evaluation_data\(val\)"):
        model.fit(plan.dataset, validation_data=val, epochs=1, verbose=0)
    history = model.fit(
        plan.dataset, validation_data=plan.evaluation_data(val), epochs=1, verbose=0
    ).history
    assert np.isfinite(history["val_loss"][0])
