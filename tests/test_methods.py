"""tfaccel.methods with plain Keras: label mixing, EMA, schedules, resizing, freezing,
stochastic depth, composition rules and bad input, each against hand-computed numbers."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import methods
from tfaccel.methods.adaptive import Plateau

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 6)).astype("float32")
Y = RNG.integers(0, 3, size=40).astype("int32")


def dense_model(seed=1, logits=False):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation=None if logits else "softmax"),
        ]
    )


def dataset(x=X, y=Y, batch=8):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


# -- label mixing --------------------------------------------------------------------------


def test_mixup_mixes_rows_and_one_hot_labels_exactly():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    y = tf.one_hot([0, 1], 3)
    t = {"mix_weight": tf.constant([0.7, 0.25]), "permutation_order": tf.constant([1, 0])}
    mixed_x, mixed_y = methods.MixUp(0.2).mix(x, y, t)
    np.testing.assert_allclose(mixed_x, [[1.6, 2.6], [1.5, 2.5]], atol=1e-6)
    np.testing.assert_allclose(mixed_y, [[0.7, 0.3, 0.0], [0.75, 0.25, 0.0]], atol=1e-6)


def test_mixup_of_images_goes_through_keras_layer_with_the_same_numbers():
    x = tf.reshape(tf.range(2 * 2 * 2 * 1, dtype=tf.float32), (2, 2, 2, 1))
    y = tf.one_hot([2, 0], 3)
    t = {"mix_weight": tf.constant([0.5, 0.9]), "permutation_order": tf.constant([1, 0])}
    mixed_x, mixed_y = methods.MixUp().mix(x, y, t)
    want = np.stack([0.5 * x[0] + 0.5 * x[1], 0.9 * x[1] + 0.1 * x[0]])
    np.testing.assert_allclose(mixed_x, want, atol=1e-6)
    np.testing.assert_allclose(mixed_y, [[0.5, 0, 0.5], [0.9, 0, 0.1]], atol=1e-6)


def test_cutmix_pastes_the_box_and_weighs_labels_by_its_pixels():
    x = tf.stack([tf.zeros((4, 4, 1)), tf.ones((4, 4, 1))])
    y = tf.one_hot([0, 1], 2)
    inside = np.zeros((2, 4, 4), bool)
    inside[0, :2, :2] = True  # example 0 gets 4 of 16 pixels from example 1
    t = methods.CutMix.box_transformation(inside, [1, 0])
    mixed_x, mixed_y = methods.CutMix().mix(x, y, t)
    assert float(tf.reduce_sum(mixed_x[0])) == 4.0
    assert float(tf.reduce_sum(mixed_x[0, :2, :2])) == 4.0
    assert float(tf.reduce_sum(mixed_x[1])) == 16.0  # no box: unchanged
    np.testing.assert_allclose(mixed_y, [[0.75, 0.25], [0.0, 1.0]], atol=1e-6)


def test_cutmix_draws_boxes_whose_label_weight_is_the_kept_share():
    t = methods.CutMix(1.0).transformation(tf.constant([6, 8, 8, 3]), tf.constant([3, 4], tf.int64))
    kept = 1.0 - tf.reduce_mean(tf.cast(t["batch_masks"], tf.float32), axis=[1, 2, 3])
    np.testing.assert_allclose(t["mix_weight"], kept, atol=1e-6)
    assert sorted(t["permutation_order"].numpy().tolist()) == list(range(6))


def test_mixup_through_for_fit_sparse_labels_become_mixed_one_hot_and_repeat_by_seed():
    x = np.eye(4, 6, dtype="float32") * 10  # example i: 10 at feature i, class i
    y = np.arange(4, dtype="int32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="softmax")])
    ds = dataset(x, y, batch=4)

    def batches(seed):
        plan = methods.for_fit(
            [methods.MixUp(0.4)],
            model,
            ds,
            epochs=1,
            loss="sparse_categorical_crossentropy",
            seed=seed,
        )
        return [(a.numpy(), b.numpy()) for a, b in plan.dataset], plan

    first, plan = batches(7)
    again, _ = batches(7)
    (mx, my) = first[0]
    assert isinstance(plan.loss, keras.losses.CategoricalCrossentropy)
    np.testing.assert_allclose(my.sum(axis=1), 1.0, atol=1e-6)
    # Each row's labels name its pair and weights; the features follow the same weights.
    np.testing.assert_allclose(mx[:, :4], my * 10, atol=1e-5)
    np.testing.assert_array_equal(first[0][1], again[0][1])


def test_label_smoothing_keeps_from_logits_and_smooths_once():
    model = dense_model(logits=True)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    plan = methods.for_fit(
        [methods.MixUp(0.2), methods.LabelSmoothing(0.1)], model, dataset(), epochs=1, loss=loss
    )
    config = plan.loss.get_config()
    assert isinstance(plan.loss, keras.losses.CategoricalCrossentropy)  # OneHotCrossentropy
    assert config["from_logits"] is True
    assert config["label_smoothing"] == pytest.approx(0.1)
    assert [m.name for m in plan.maps] == ["one-hot labels", "mixup"]  # one-hot once


# -- EMA -----------------------------------------------------------------------------------


class Weights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(self.model.layers[0].kernel.numpy().copy())


def test_ema_weights_equal_the_hand_computed_average_and_are_what_is_saved(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, use_bias=False)])
    y = X @ np.arange(6, dtype="float32")
    plan = methods.for_fit(
        [methods.EMA(0.5)],
        model,
        dataset(X, y, batch=10),
        epochs=1,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.05),
    )
    weights = Weights()
    model.compile(plan.optimizer, plan.loss)
    model.fit(plan.dataset, epochs=1, callbacks=[weights, *plan.callbacks], verbose=0)
    average = weights.seen[0]
    for w in weights.seen[1:]:
        average = 0.5 * average + 0.5 * w
    assert len(weights.seen) == 4
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), average, rtol=1e-6)
    assert not np.allclose(average, weights.seen[-1])
    path = str(tmp_path / "ema.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    np.testing.assert_allclose(loaded.layers[0].kernel.numpy(), average, rtol=1e-6)


def test_ema_evaluates_validation_with_the_averages():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, use_bias=False)])
    y = X @ np.arange(6, dtype="float32")
    plan = methods.for_fit(
        [methods.EMA(0.5)],
        model,
        dataset(X, y, batch=10),
        epochs=2,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.05),
    )
    model.compile(plan.optimizer, plan.loss)
    history = model.fit(
        plan.dataset, epochs=2, validation_data=dataset(X, y), callbacks=plan.callbacks, verbose=0
    )
    # After fit the model holds the averages; the last validation loss was computed on them.
    want = float(np.mean((X @ model.layers[0].kernel.numpy()[:, 0] - y) ** 2))
    assert history.history["val_loss"][-1] == pytest.approx(want, rel=1e-4)


# -- schedules -----------------------------------------------------------------------------


def job(epochs=2, steps=10, batch=32, optimizer=None):
    return methods.Job(
        dense_model(),
        "sparse_categorical_crossentropy",
        optimizer or keras.optimizers.Adam(1e-3),
        dataset().element_spec,
        epochs,
        steps,
        batch,
    )


def test_one_cycle_rate_at_chosen_steps_is_the_formula():
    schedule = methods.OneCycle(peak=0.1, warmup=0.3).make(job(epochs=2, steps=10))
    rate = lambda step: float(schedule(step))  # noqa: E731
    alpha = 1 / (25 * 1e4)
    assert rate(0) == pytest.approx(0.1 / 25)
    assert rate(3) == pytest.approx(0.1 / 25 + (0.1 - 0.1 / 25) * 3 / 6)
    assert rate(6) == pytest.approx(0.1)
    assert rate(13) == pytest.approx(0.1 * ((1 - alpha) * 0.5 + alpha))
    assert rate(20) == pytest.approx(0.1 * alpha, rel=1e-4)


def test_warmup_cosine_peak_is_sized_to_the_batch_and_reaches_final():
    schedule = methods.WarmupCosine(warmup=0.1, final=0.1).make(job(epochs=5, steps=20, batch=128))
    peak = 1e-3 * math.sqrt(128 / 32)
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(5)) == pytest.approx(peak * 5 / 10)
    assert float(schedule(10)) == pytest.approx(peak)
    cosine = 0.5 * (1 + math.cos(math.pi * 45 / 90))
    assert float(schedule(55)) == pytest.approx(peak * (0.9 * cosine + 0.1), rel=1e-5)
    assert float(schedule(100)) == pytest.approx(peak * 0.1, rel=1e-5)


class Rates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(float(self.model.optimizer.learning_rate))


def test_schedule_drives_the_optimizer_in_model_fit():
    model = dense_model()
    plan = methods.for_fit(
        methods.WarmupCosine(peak=0.01, warmup=0.2),
        model,
        dataset(),
        epochs=2,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.SGD(0.1),
    )
    rates = Rates()
    model.compile(plan.optimizer, plan.loss)
    model.fit(plan.dataset, epochs=2, callbacks=[rates], verbose=0)
    schedule = plan.methods[0].schedule
    np.testing.assert_allclose(rates.seen, [float(schedule(s)) for s in range(10)], rtol=1e-6)
    assert rates.seen[2] == pytest.approx(0.01)


# -- progressive resizing, freezing, stochastic depth --------------------------------------


def image_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((None, None, 1)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


IMAGES = RNG.normal(size=(24, 16, 16, 1)).astype("float32")
IMAGE_LABELS = RNG.integers(0, 3, size=24).astype("int32")


def test_progressive_resizing_uses_at_most_its_stages_and_ends_full_size():
    model = image_model()
    method = methods.ProgressiveResizing(start=0.5, stages=3, until=0.75)
    ds = dataset(IMAGES, IMAGE_LABELS, batch=8)
    plan = methods.for_fit([method], model, ds, epochs=8, loss="sparse_categorical_crossentropy")
    assert method.sizes(16) == (8, 12, 16)
    seen = []
    for epoch in range(8):
        method.callback.on_epoch_begin(epoch)
        seen.append({tuple(x.shape[1:3]) for x, _ in plan.dataset})
    assert all(len(s) == 1 for s in seen)
    sizes = [next(iter(s))[0] for s in seen]
    assert sizes == [8, 8, 8, 12, 12, 12, 16, 16]  # 6 of 8 epochs small, 3 each
    assert len(set(sizes)) <= method.stages


def test_progressive_resizing_traces_the_step_at_most_once_per_stage():
    traces = []

    class Count(keras.layers.Layer):
        def call(self, x):
            traces.append(tuple(x.shape))  # runs when the step is traced
            return x

    model = image_model()
    model = keras.Sequential([keras.Input((None, None, 1)), Count(), *model.layers])
    method = methods.ProgressiveResizing(start=0.5, stages=3, until=0.75)
    ds = dataset(IMAGES, IMAGE_LABELS, batch=8)
    plan = methods.for_fit([method], model, ds, epochs=4, loss="sparse_categorical_crossentropy")
    traces.clear()
    model.compile("adam", plan.loss)
    model.fit(plan.dataset, epochs=4, callbacks=plan.callbacks, verbose=0)
    assert method.callback.seen == [8, 8, 12, 16]
    assert 1 <= len(traces) <= method.stages


def test_layer_freezing_stops_the_early_layers_from_the_chosen_epoch():
    model = dense_model()
    kernels = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: kernels.append(
            [model.layers[0].kernel.numpy().copy(), model.layers[1].kernel.numpy().copy()]
        )
    )
    plan = methods.for_fit(
        [methods.LayerFreezing(start=0.5, fraction=0.5)],
        model,
        dataset(),
        epochs=4,
        loss="sparse_categorical_crossentropy",
    )
    model.compile("adam", plan.loss)
    model.fit(plan.dataset, epochs=4, callbacks=[*plan.callbacks, record], verbose=0)
    assert not np.allclose(kernels[0][0], kernels[1][0])  # epochs 0-1: both train
    np.testing.assert_array_equal(kernels[1][0], kernels[3][0])  # epochs 2-3: frozen
    assert not np.allclose(kernels[1][1], kernels[3][1])  # the last layer still trains
    assert model.layers[0].trainable  # given back trainable when fit ends


def resnet_like():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 4))
    x = tfaccel.blocks.ResidualBlock(4, name="a")(inputs)
    x = tfaccel.blocks.ResidualBlock(4, name="b")(x)
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs)


def test_stochastic_depth_rates_follow_depth_and_drop_whole_branches(tmp_path):
    model = resnet_like()
    ds = dataset(RNG.normal(size=(8, 8, 8, 4)).astype("float32"), Y[:8])
    methods.for_fit(
        [methods.StochasticDepth(0.5)], model, ds, epochs=1, loss="sparse_categorical_crossentropy"
    )
    block = model.get_layer("b")
    assert [model.get_layer("a").drop_rate, block.drop_rate] == [0.25, 0.5]
    x = tf.constant(np.abs(RNG.normal(size=(64, 8, 8, 4))).astype("float32"))
    hidden = tf.nn.relu(block.bn1(block.conv1(x), training=True))
    branch = block.bn2(block.conv2(hidden), training=True)
    out = block(x, training=True).numpy()
    dropped = np.maximum(x.numpy(), 0)
    kept = np.maximum(branch.numpy() / 0.5 + x.numpy(), 0)
    is_dropped = [np.allclose(o, d, atol=1e-5) for o, d in zip(out, dropped, strict=True)]
    is_kept = [np.allclose(o, k, atol=1e-4) for o, k in zip(out, kept, strict=True)]
    assert all(a != b for a, b in zip(is_dropped, is_kept, strict=True))
    assert 10 < sum(is_dropped) < 54  # about half of 64
    np.testing.assert_allclose(block(x, training=False), block(x, training=False))
    path = str(tmp_path / "sd.keras")
    model.save(path)
    assert keras.saving.load_model(path).get_layer("b").drop_rate == 0.5


# -- composition and bad input -------------------------------------------------------------


def test_composition_rules_say_what_was_dropped_and_why():
    plan = methods.for_fit(
        [
            methods.MixUp(),
            methods.CutMix(),
            methods.OneCycle(),
            methods.WarmupCosine(),
            methods.LabelSmoothing(0.1),
            methods.LabelSmoothing(0.2),
        ],
        image_model(),
        dataset(IMAGES, IMAGE_LABELS),
        epochs=2,
        loss="sparse_categorical_crossentropy",
    )
    assert [m.name for m in plan.methods] == ["one-cycle", "label smoothing", "mixup"]
    dropped = dict(plan.dropped)
    assert set(dropped) == {"cutmix", "warmup-cosine", "label smoothing"}
    assert "one batch mixing" in dropped["cutmix"]
    assert "given twice" in dropped["label smoothing"]
    assert plan.loss.get_config()["label_smoothing"] == pytest.approx(0.1)
    assert "dropped" in plan.describe()


def test_fast_resolves_per_kind_and_unknown_names_are_refused():
    assert [m.name for m in methods.resolve("fast", kind="sequence")]
    assert methods.resolve(None) == [] and methods.resolve("none") == []
    with pytest.raises(ValueError, match="'fast', 'none'"):
        methods.resolve("faster")
    with pytest.raises(ValueError, match="kind"):
        methods.resolve("fast", kind="audio")
    with pytest.raises(TypeError, match="not a tfaccel.methods method"):
        methods.resolve([keras.callbacks.EarlyStopping()])


@pytest.mark.parametrize(
    "kind, short_stack, grown",
    [
        (
            "sequence",
            [("plateau", (10.0, 1.0)), ("label smoothing", None)],
            [("progressive batch", (4, 3, 2.0)), ("plateau", (3.0, 1.0))],
        ),
        (
            "tabular",
            [],  # no method measured faster on a short table
            [("progressive batch", (8, 4, 8.0)), ("plateau", (3.0, 1.0))],
        ),
    ],
)
def test_fast_for_sequences_and_tables_depends_on_the_jobs_length(kind, short_stack, grown):
    def settings(method):
        if isinstance(method, methods.ProgressiveBatch):
            return (method.default_growth, method.stages, method.ramp_epochs)
        scheduled = isinstance(method, methods.OneCycle | Plateau)
        return (method.scale, method.warmup) if scheduled else None

    def stack(steps=None, epochs=10):
        given = None if steps is None else job(epochs=epochs, steps=steps)
        chosen = methods.resolve("fast", kind=kind, job=given)
        return [(m.name, settings(m)) for m in chosen]

    long = methods.LONG_EPOCH_STEPS  # steps an epoch: the declared epochs do not count
    for epochs in (1, 10, 1_000):
        assert stack(long - 1, epochs) == short_stack
        assert stack(long, epochs) == [*grown, ("label smoothing", None)]
    assert stack() == short_stack  # no job (names checked before fit): the short stack
    images = methods.resolve("fast", kind="image", job=job(epochs=10, steps=1))
    assert [m.name for m in images][0] == "progressive batch"  # images grow at any length


def test_the_table_says_why_fast_chose_its_stack():
    def plan(given, epochs):
        opt = keras.optimizers.Adam()
        loss = "sparse_categorical_crossentropy"
        return methods.for_fit(
            given, dense_model(), dataset(), epochs=epochs, loss=loss, optimizer=opt
        )

    steps = int(dataset().cardinality())
    rows = dataset(np.tile(X, (5, 1)), np.tile(Y, 5), batch=1)  # 200 steps an epoch
    loss = "sparse_categorical_crossentropy"
    long = methods.for_fit("fast", dense_model(), rows, epochs=1, loss=loss, optimizer="adam")
    why = long.table()[0][1]
    assert long.table()[0][0] == "fast" and why.startswith("the stack measured best for tabular")
    assert "(200 steps an epoch): the batch grown 8x over the first 8 epochs" in why
    assert long.table()[1][0] == "progressive batch"
    short = plan("fast", 2)
    assert short.methods == [] and short.table() == [
        (
            "fast",
            f"no method: none measured faster on tabular jobs under 200 steps an epoch "
            f"({steps} steps an epoch); the job trains as given",
        ),
        ("input", methods.base.FREED_NOTE),  # for_fit's datasets, with or without methods
    ]
    assert float(short.optimizer.learning_rate) == pytest.approx(0.001)  # Adam's, unscheduled
    freed = tfaccel.data.iterators.adopt
    passed = tfaccel.data.graph.passed_through_with
    assert passed(short.dataset) is freed  # what the row says: both datasets freed
    assert passed(short.evaluation_data(dataset())) is freed
    assert all(name != "fast" for name, _ in plan([methods.OneCycle()], 2).table())


REGRESSION = dataset(X, X[:, 0])


@pytest.mark.parametrize(
    "make, data, loss, match",
    [
        (lambda: methods.MixUp(), REGRESSION, "mse", "regression loss"),
        (lambda: methods.MixUp(), REGRESSION, "sparse_categorical_crossentropy", "float labels"),
        (lambda: methods.CutMix(), dataset(), "sparse_categorical_crossentropy", "images"),
        (
            lambda: methods.OneCycle(steps=100),
            dataset(),
            "sparse_categorical_crossentropy",
            "longer than the job",
        ),
        (lambda: methods.EMA(0.999), dataset(), "sparse_categorical_crossentropy", "averages"),
        (
            lambda: methods.ProgressiveResizing(),
            dataset(),
            "sparse_categorical_crossentropy",
            "images",
        ),
        (
            lambda: methods.StochasticDepth(0.1),
            dataset(),
            "sparse_categorical_crossentropy",
            "residual",
        ),
    ],
)
def test_bad_input_raises_before_step_one(make, data, loss, match):
    model = dense_model()
    optimizer = keras.optimizers.Adam()
    with pytest.raises(ValueError, match=match):
        methods.for_fit([make()], model, data, epochs=2, loss=loss, optimizer=optimizer)
    assert not optimizer.built


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_ema_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        methods.EMA(decay)


def test_a_built_optimizer_is_refused_with_the_fix():
    model = dense_model()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(dataset(), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="fresh optimizer"):
        methods.for_fit(
            [methods.EMA(0.9)],
            model,
            dataset(),
            epochs=3,
            loss="sparse_categorical_crossentropy",
            optimizer=model.optimizer,
        )
