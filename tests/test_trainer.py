import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import precision

RNG = np.random.default_rng(0)
X = RNG.normal(size=(70, 6)).astype("float32")
Y = RNG.integers(0, 3, size=70).astype("int32")


def build(seed=1, batch_norm=True):
    keras.utils.set_random_seed(seed)
    layers = [
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.l2(0.01)),
    ]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(3, activation="softmax", dtype="float32"))
    return keras.Sequential(layers)


def dataset(batch=16, drop_remainder=False):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch, drop_remainder=drop_remainder)


def trainer(strategy=None, **kwargs):
    kwargs.setdefault("steps_per_loop", 3)
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy or tf.distribute.get_strategy(),
        **kwargs,
    )


class Losses(keras.callbacks.Callback):
    """Records the loss of every batch call."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(logs["loss"])


def max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_same_weights_losses_and_metrics_as_model_fit(distributed, mirrored):
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    with strategy.scope():
        reference = build()
        reference.compile(
            keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    # 70 examples, batch 16: the last batch holds 6 (3 per replica).
    expected = reference.fit(dataset(), epochs=2, shuffle=False, verbose=0).history
    ours = trainer(strategy)
    history = ours.fit(dataset(), epochs=2, verbose=0).history
    assert max_diff(reference.get_weights(), ours.model.get_weights()) < 1e-5
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], expected["accuracy"], rtol=1e-5)
    want = reference.evaluate(dataset(), verbose=0, return_dict=True)
    got = ours.evaluate(dataset())
    assert got == pytest.approx(want, rel=1e-5)


class Subclassed(keras.Model):
    """A subclassed model without build(): its layers get weights on the first call."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(3, activation="softmax")

    def call(self, x):
        return self.out(self.hidden(x))


@pytest.mark.parametrize("prebuilt", [False, True], ids=["unbuilt", "build-called"])
def test_subclassed_model_without_build_trains_like_model_fit(prebuilt, mirrored):
    def make():
        keras.utils.set_random_seed(3)
        model = Subclassed()
        if prebuilt:  # Keras marks it built, without weights (with a warning)
            with pytest.warns(UserWarning, match="does not have a `build\\(\\)` method"):
                model.build((None, 6))
        return model

    with mirrored.scope():
        reference = make()
        reference.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    expected = reference.fit(dataset(), epochs=2, shuffle=False, verbose=0).history
    ours = tfaccel.Trainer(
        make,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        strategy=mirrored,
    )
    history = ours.fit(dataset(), epochs=2, verbose=0).history
    assert len(ours.model.weights) == 4
    assert max_diff(reference.get_weights(), ours.model.get_weights()) < 1e-5
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)


def test_steps_per_loop_does_not_change_the_result():
    one, many = trainer(steps_per_loop=1), trainer(steps_per_loop=4)
    one.fit(dataset(), epochs=2, verbose=0)
    many.fit(dataset(), epochs=2, verbose=0)
    assert max_diff(one.model.get_weights(), many.model.get_weights()) == 0.0
    assert int(one.step.numpy()) == int(many.step.numpy()) == 10


def test_dataset_function_under_mirrored_strategy(mirrored):
    def dataset_fn(context):
        per_replica = context.get_per_replica_batch_size(16)
        ds = tf.data.Dataset.from_tensor_slices((X[:64], Y[:64]))
        return ds.shard(context.num_input_pipelines, context.input_pipeline_id).batch(per_replica)

    ours = trainer(mirrored)
    history = ours.fit(dataset_fn, epochs=3, verbose=0)
    assert len(history.history["loss"]) == 3
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert int(ours.step.numpy()) == 3 * 4


def test_steps_per_epoch_with_repeating_dataset():
    ours = trainer()
    history = ours.fit(dataset().repeat(), epochs=2, steps_per_epoch=7, verbose=0)
    assert int(ours.step.numpy()) == 14
    assert len(history.history["loss"]) == 2


def test_settings_table_is_printed(capsys):
    ours = trainer(steps_per_loop=5)
    ours.fit(dataset(), epochs=1, verbose=2)
    out = capsys.readouterr().out
    for key in ("strategy", "replicas", "global_batch", "dtype_policy", "jit_compile"):
        assert key in out
    assert ours.settings["global_batch"] == 16
    assert ours.settings["steps_per_loop"] == 5
    assert ours.settings["jit_compile"].startswith("False (not measured: a first epoch of")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains(policy):
    with precision.scope(policy):
        ours = tfaccel.Trainer(
            lambda: build(batch_norm=False),
            optimizer=lambda: keras.optimizers.Adam(0.05),
            loss="sparse_categorical_crossentropy",
            strategy=tf.distribute.get_strategy(),
        )
        history = ours.fit(dataset(), epochs=4, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    scaled = isinstance(ours.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    assert ("loss_scale" in history) == scaled


def test_non_finite_gradient_is_skipped_and_loss_scale_drops():
    x = X.copy()
    x[16] = np.inf  # the second batch of 16 has an inf input
    data = tf.data.Dataset.from_tensor_slices((x, Y)).batch(16)
    with precision.scope("mixed_float16"):
        ours = tfaccel.Trainer(
            lambda: build(batch_norm=False),
            optimizer=lambda: keras.optimizers.SGD(0.01),
            loss="sparse_categorical_crossentropy",
            strategy=tf.distribute.get_strategy(),
            steps_per_loop=2,
        )
        history = ours.fit(data, epochs=1, verbose=0).history
    assert ours.skipped_steps == 1
    assert history["skipped_steps"] == [1]
    assert history["loss_scale"] == [2.0**15 / 2]
    assert all(np.isfinite(w).all() for w in ours.model.get_weights())
    assert int(ours.optimizer.iterations.numpy()) == int(ours.step.numpy()) - 1


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(f"epoch_begin {epoch}")

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(f"batch_begin {batch}")

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(f"batch_end {batch} steps={int(logs['steps'])}")
        assert {"loss", "accuracy", "examples_per_second"} <= set(logs)

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(f"epoch_end {epoch} {sorted(logs)}")

    def on_train_end(self, logs=None):
        self.calls.append("train_end")


def test_callbacks_fire_once_per_loop_in_order():
    recorder = Recorder()
    ours = trainer(steps_per_loop=3)
    ours.fit(dataset(), epochs=2, validation_data=dataset(), callbacks=[recorder], verbose=0)
    assert recorder.model is ours.model
    keys = ["accuracy", "loss", "val_accuracy", "val_loss"]
    epoch = [
        "batch_begin 0",
        "batch_end 2 steps=3",
        "batch_begin 3",
        "batch_end 4 steps=2",
    ]
    assert recorder.calls == [
        "train_begin",
        "epoch_begin 0",
        *epoch,
        f"epoch_end 0 {keys}",
        "epoch_begin 1",
        *epoch,
        f"epoch_end 1 {keys}",
        "train_end",
    ]


def test_keras_callbacks_work(tmp_path):
    ours = trainer()
    history = ours.fit(
        dataset(),
        epochs=4,
        validation_data=dataset(),
        verbose=0,
        callbacks=[
            keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
            keras.callbacks.ModelCheckpoint(str(tmp_path / "model.keras")),
            keras.callbacks.TensorBoard(str(tmp_path / "tb")),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0),
            keras.callbacks.TerminateOnNaN(),
        ],
    )
    rows = (tmp_path / "log.csv").read_text().strip().splitlines()
    assert len(rows) == 5 and "val_loss" in rows[0]
    assert keras.models.load_model(tmp_path / "model.keras").count_params() > 0
    assert list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))
    assert float(ours.optimizer.learning_rate.numpy()) < 0.1
    assert history.history["learning_rate"][0] == pytest.approx(0.1)


def test_early_stopping_and_terminate_on_nan_stop_training():
    ours = trainer()
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=100.0)
    history = ours.fit(dataset(), epochs=10, callbacks=[stopper], verbose=0)
    assert len(history.history["loss"]) == 2


def test_terminate_on_nan_stops_at_the_first_non_finite_loss():
    # NaN inputs make the first step's gradients, and so the weights, NaN. The Trainer's
    # finite-weights check stops in that loop with TrainingDivergedError; whether the
    # first loss is already NaN depends on the Keras version (how cross-entropy clips).
    # What a user relies on: training stops at the first non-finite loss or weights, and
    # no later step runs (TerminateOnNaN in the callbacks changes nothing about that).
    data = tf.data.Dataset.from_tensor_slices((np.full_like(X, np.nan), Y)).batch(16)
    ours = trainer(steps_per_loop=1)
    losses = Losses()
    with pytest.raises(tfaccel.TrainingDivergedError, match="holds NaN or inf after step 1"):
        ours.fit(data, epochs=3, callbacks=[losses, keras.callbacks.TerminateOnNaN()], verbose=0)
    assert int(ours.step.numpy()) == 1
    assert losses.seen == []  # stopped before any later step or batch callback
    assert not all(np.isfinite(w).all() for w in ours.model.get_weights())


def test_terminate_on_nan_stops_the_trainer_when_weights_stay_finite():
    # Loss scaling skips the non-finite steps, so the weights stay finite and only the
    # loss says something is wrong: TerminateOnNaN stops in the loop that reports it.
    ours = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)]),
        optimizer=lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
        loss="mse",
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
    )
    labels = np.where(np.arange(70) < 32, 0.0, np.nan).astype("float32")  # batch 3 on: NaN
    data = tf.data.Dataset.from_tensor_slices((X, labels)).batch(16)
    losses = Losses()
    ours.fit(data, epochs=3, callbacks=[losses, keras.callbacks.TerminateOnNaN()], verbose=0)
    assert len(losses.seen) == 3 and np.isfinite(losses.seen[:2]).all()
    assert not np.isfinite(losses.seen[2])
    assert int(ours.step.numpy()) == 3  # no step after the first non-finite loss
    assert all(np.isfinite(w).all() for w in ours.model.get_weights())


# Bad input: each gets a clear error.


def test_unbatched_dataset():
    with pytest.raises(ValueError, match="looks unbatched"):
        trainer().fit(tf.data.Dataset.from_tensor_slices((X, Y)), verbose=0)


def test_elements_that_are_not_pairs():
    with pytest.raises(ValueError, match=r"tuple \(x, y\) or \(x, y, sample_weight\)"):
        trainer().fit(tf.data.Dataset.from_tensor_slices(X).batch(8), verbose=0)
    data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(8)
    with pytest.raises(ValueError, match="Map it first"):
        trainer().fit(data, verbose=0)


def test_model_not_built_under_the_strategy_is_copied_into_it(mirrored):
    model = build()  # BatchNormalization's moving statistics are copied too
    ours = tfaccel.Trainer(model, loss="sparse_categorical_crossentropy", strategy=mirrored)
    assert ours.model is not model and ours.source_model is model
    assert max_diff(model.get_weights(), ours.model.get_weights()) == 0.0
    ours.fit(dataset(), verbose=0)
    assert max_diff(model.get_weights(), ours.model.get_weights()) == 0.0  # copied back


def test_global_batch_not_divisible_by_replicas(mirrored):
    with pytest.raises(ValueError, match="global batch of 15.*2 replicas"):
        trainer(mirrored).fit(dataset(15, drop_remainder=True), verbose=0)


def test_data_of_unknown_length_that_yields_nothing_is_an_error():
    empty = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: y > 5).batch(16)
    ours = trainer()
    with pytest.raises(ValueError, match="yielded no batch in epoch 1.*a filter that keeps"):
        ours.fit(empty, epochs=2, verbose=0)
    assert int(ours.step.numpy()) == 0


def test_one_shot_data_stops_training_with_a_warning_and_no_empty_epoch():
    batches = iter(list(dataset().as_numpy_iterator()))  # one pass, then nothing
    spec = (tf.TensorSpec((None, 6), tf.float32), tf.TensorSpec((None,), tf.int32))
    one_shot = tf.data.Dataset.from_generator(lambda: batches, output_signature=spec)
    ours = trainer()
    with pytest.warns(UserWarning, match="yielded no batch in epoch 2; training stops"):
        history = ours.fit(one_shot, epochs=3, verbose=0).history
    assert len(history["loss"]) == 1 and history["loss"][0] > 0
    assert int(ours.step.numpy()) == 5  # 70 examples in batches of 16


def test_infinite_dataset_needs_steps_per_epoch():
    with pytest.raises(ValueError, match="infinite.*steps_per_epoch"):
        trainer().fit(dataset().repeat(), verbose=0)


@pytest.mark.parametrize("value", [0, -1, 2.5, "fast"])
def test_bad_steps_per_loop(value):
    with pytest.raises(ValueError, match="steps_per_loop"):
        trainer(steps_per_loop=value)


@pytest.mark.parametrize("kwargs", [{"epochs": -1}, {"epochs": 1.5}, {"steps_per_epoch": 0}])
def test_bad_epochs_or_steps_per_epoch(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        trainer().fit(dataset(), verbose=0, **kwargs)


def test_loss_that_cannot_be_reduced_per_example():
    ours = tfaccel.Trainer(
        build,
        optimizer="sgd",
        loss=lambda y, p: tf.reduce_mean(tf.square(p)),
        strategy=tf.distribute.get_strategy(),
    )
    with pytest.raises(ValueError, match="returned a scalar"):
        ours.fit(dataset(), verbose=0)


class NoXLA(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, x):
        return x


class HostOp(keras.layers.Layer):
    def call(self, x):
        y = tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False)
        y.set_shape(x.shape)
        return y

    def compute_output_shape(self, input_shape):
        return input_shape


def test_jit_compile_with_a_layer_xla_does_not_support():
    def model_with(layer):
        return lambda: keras.Sequential([keras.Input((6,)), layer, keras.layers.Dense(3)])

    with pytest.raises(ValueError, match=r"\['no_xla'\] do not support XLA"):
        tfaccel.Trainer(model_with(NoXLA(name="no_xla")), loss="mse", jit_compile=True)
    ours = tfaccel.Trainer(
        model_with(HostOp(name="host_op")),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        strategy=tf.distribute.get_strategy(),
    )
    with pytest.raises(ValueError, match=r"XLA cannot compile layer\(s\) \['host_op'\].*PyFunc"):
        ours.fit(dataset(), verbose=0)


def test_trains_on_tfaccel_data_pipeline_under_mirrored(mirrored):
    train = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(X[:64], Y[:64]),
        batch_size=16,
        training=True,
        seed=0,
        strategy=mirrored,
    )
    assert isinstance(train, tfaccel.data.DatasetFn)
    ours = trainer(mirrored)
    history = ours.fit(train, epochs=3, verbose=0)
    assert ours.settings["global_batch"] == 16
    assert ours.settings["per_replica_batch"] == 8
    assert int(ours.step.numpy()) == 3 * 4
    assert history.history["loss"][-1] < history.history["loss"][0]
    evaluation = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(X, Y), batch_size=16, training=False, strategy=mirrored
    )
    assert set(ours.evaluate(evaluation)) == {"loss", "accuracy"}
