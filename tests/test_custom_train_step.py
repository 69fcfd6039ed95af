"""A model's own `train_step` / `test_step` / `compute_loss` run inside the Trainer's loops,
equal to `model.fit`; what only the Trainer's own step can do is refused before step 1."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import devices
from tfaccel.train.setup import model_steps

CPUS = ["/cpu:0", "/cpu:1"]  # conftest's two logical CPUs

RNG = np.random.default_rng(0)
REAL = RNG.normal(size=(70, 6)).astype("float32")
NOISE = RNG.normal(size=(70, 4)).astype("float32")
X = RNG.normal(size=(70, 6)).astype("float32")
Y = RNG.integers(0, 3, size=70).astype("int32")


class GAN(keras.Model):
    """A GAN-style model: two optimizers of its own, metrics of its own, no compiled loss."""

    def __init__(self):
        super().__init__()
        # One layer each: a step's trace (the tests' cost) grows with the variables.
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)])
        self.discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        self.d_tracker = keras.metrics.Mean(name="d_loss")
        self.g_tracker = keras.metrics.Mean(name="g_loss")

    def call(self, x):
        return self.discriminator(x)

    @property
    def metrics(self):
        return [self.d_tracker, self.g_tracker]

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.bce = keras.losses.BinaryCrossentropy(from_logits=True)

    def train_step(self, data):
        real, noise = data
        ones, zeros = tf.ones_like(real[:, :1]), tf.zeros_like(real[:, :1])
        discriminator, generator = self.discriminator, self.generator
        with tf.GradientTape() as tape:
            d_loss = self.bce(ones, discriminator(real)) + self.bce(
                zeros, discriminator(generator(noise))
            )
        grads = tape.gradient(d_loss, discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, discriminator.trainable_weights, strict=True))
        with tf.GradientTape() as tape:
            g_loss = self.bce(ones, discriminator(generator(noise)))
        grads = tape.gradient(g_loss, generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, generator.trainable_weights, strict=True))
        self.d_tracker.update_state(d_loss)
        self.g_tracker.update_state(g_loss)
        return {"d_loss": self.d_tracker.result(), "g_loss": self.g_tracker.result()}


def make_gan():
    keras.utils.set_random_seed(5)
    gan = GAN()
    gan.compile(keras.optimizers.Adam(1e-2), keras.optimizers.SGD(0.1))
    return gan


def gan_data(batch=16):
    return tf.data.Dataset.from_tensor_slices((REAL, NOISE)).batch(batch)


def max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def gan_runs():
    """The GAN's uninterrupted 2 epochs, by `model.fit` and by the Trainer (3 steps a loop),
    run once a strategy ("default", "mirrored") for the tests that compare against them."""
    runs = {}

    def run(kind):
        if kind not in runs:
            distributed = kind == "mirrored"
            strategy = devices.strategy("mirrored", devices=CPUS) if distributed else None
            strategy = strategy or tf.distribute.get_strategy()
            with strategy.scope():
                reference = make_gan()
            expected = reference.fit(gan_data(), epochs=2, shuffle=False, verbose=0).history
            trainer = tfaccel.Trainer(make_gan, strategy=strategy, steps_per_loop=3)
            history = trainer.fit(gan_data(), epochs=2, verbose=0).history
            runs[kind] = types.SimpleNamespace(
                reference=reference.get_weights(),
                expected=expected,
                weights=trainer.model.get_weights(),
                history=history,
                iterations=[
                    int(o.iterations.numpy())
                    for o in (trainer.model.d_optimizer, trainer.model.g_optimizer)
                ],
                step=int(trainer.step.numpy()),
            )
        return runs[kind]

    return run


@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_gan_train_step_equals_model_fit(kind, gan_runs):
    runs = gan_runs(kind)
    assert max_diff(runs.reference, runs.weights) < 1e-5
    assert sorted(runs.history) == ["d_loss", "g_loss"]
    for name in ("d_loss", "g_loss"):
        np.testing.assert_allclose(runs.history[name], runs.expected[name], rtol=1e-5)
    # Both of the model's own optimizers stepped 2 epochs of 5 batches.
    assert runs.iterations == [10, 10]
    assert runs.step == 10


class Frozen(keras.Model):
    """A model whose train_step changes nothing (it only reports)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="softmax")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return {"seen": tf.cast(tf.shape(data[0])[0], tf.float32)}


def test_a_train_step_that_changes_nothing_leaves_the_weights_unchanged():
    keras.utils.set_random_seed(1)
    model = Frozen()
    model(X[:1])  # its weights exist
    model.compile("sgd", "sparse_categorical_crossentropy")
    before = [w.copy() for w in model.get_weights()]
    assert len(before) == 2
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    trainer = tfaccel.Trainer(model, strategy=tf.distribute.get_strategy(), steps_per_loop=2)
    history = trainer.fit(data, epochs=2, verbose=0).history
    assert max_diff(before, model.get_weights()) == 0.0
    assert history["seen"] == [6.0, 6.0]  # model.fit's logs: the last step's (70 = 4 x 16 + 6)
    assert int(trainer.step.numpy()) == 10


def make_classifier(kind, metrics=("accuracy",)):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((6,))
    model = kind(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
    model.compile(
        keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=list(metrics) or None
    )
    return model


class CustomLoss(keras.Model):
    """`compute_loss` overridden: the compiled loss plus a penalty on the outputs."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.5 * keras.ops.mean(keras.ops.square(y_pred))


class CustomTest(keras.Model):
    """`test_step` overridden: evaluation reports its own numbers."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        return {"mean_output": tf.reduce_mean(y_pred), "rows": tf.cast(tf.shape(y)[0], "float32")}


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_compute_loss_override_is_used_as_model_fit_uses_it(distributed, mirrored):
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    with strategy.scope():
        reference = make_classifier(CustomLoss)  # loss and accuracy through compute_loss
    expected = reference.fit(data, epochs=2, verbose=0, validation_data=data, shuffle=False).history
    trainer = tfaccel.Trainer(lambda: make_classifier(CustomLoss), strategy=strategy)
    history = trainer.fit(data, epochs=2, verbose=0, validation_data=data).history
    assert max_diff(reference.get_weights(), trainer.model.get_weights()) < 1e-5
    assert sorted(history) == sorted(expected)
    for name, values in expected.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-5, err_msg=name)


def test_test_step_override_is_what_evaluate_runs():
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    reference = make_classifier(CustomTest, metrics=())
    want = reference.evaluate(data, verbose=0, return_dict=True)
    trainer = tfaccel.Trainer(
        make_classifier(CustomTest, ()), strategy=tf.distribute.get_strategy()
    )
    got = trainer.evaluate(data)
    assert set(got) == {"mean_output", "rows"}
    assert got == pytest.approx(want, rel=1e-6)
    assert got["rows"] == 6.0  # the last batch's, as model.evaluate
    # Compiled metrics the test_step never updates: its logs (model.evaluate raises).
    with_metrics = tfaccel.Trainer(
        make_classifier(CustomTest), strategy=tf.distribute.get_strategy()
    )
    assert with_metrics.evaluate(data) == pytest.approx(want, rel=1e-6)


class StopAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.d_optimizer.iterations.numpy()) >= self.step:
            self.model.stop_training = True


@pytest.mark.parametrize(
    ("distributed", "kind"),
    [(False, "default"), (True, "mirrored")],
    ids=["iterator-saved", "mirrored-skip"],
)
def test_gan_resumed_mid_epoch_equals_the_uninterrupted_run(
    tmp_path, distributed, kind, mirrored, gan_runs
):
    strategy = mirrored if distributed else tf.distribute.get_strategy()

    def fresh():
        return tfaccel.Trainer(make_gan, strategy=strategy, steps_per_loop=1)

    whole = gan_runs(kind)  # the Trainer's uninterrupted run (3 steps a loop)
    first = fresh()
    first.fit(gan_data(), epochs=2, verbose=0, checkpoint_dir=tmp_path, callbacks=[StopAt(7)])
    assert int(first.step.numpy()) == 7  # 2 of epoch 2's 5 batches
    resumed = fresh()
    history = resumed.fit(gan_data(), epochs=2, verbose=0, checkpoint_dir=tmp_path).history
    assert int(resumed.step.numpy()) == 10
    assert int(resumed.model.g_optimizer.iterations.numpy()) == 10  # its slots came back too
    assert max_diff(whole.weights, resumed.model.get_weights()) < 1e-6
    # The metrics' running state of the interrupted epoch came back with the checkpoint.
    np.testing.assert_allclose(history["d_loss"], whole.history["d_loss"][1:], rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"loss": "mse"}, "loss="),
        ({"metrics": ["accuracy"]}, "metrics="),
        ({"accumulate_steps": 2}, "accumulate_steps=2"),
        ({"on_oom": "accumulate"}, "on_oom='accumulate'"),
        ({"precision": "mixed_bfloat16"}, "precision='mixed_bfloat16'"),
        ({"methods": ["LabelSmoothing"]}, "methods="),
    ],
)
def test_what_needs_the_trainers_own_step_is_refused(kwargs, names):
    with pytest.raises(ValueError, match="GAN overrides train_step") as caught:
        tfaccel.Trainer(make_gan, strategy=tf.distribute.get_strategy(), **kwargs)
    assert names in str(caught.value) and "model.fit" in str(caught.value)


@pytest.mark.parametrize("none", [[], (), None, "none"])
def test_no_methods_given_as_an_empty_list_trains_the_models_own_step(none, capsys):
    trainer = tfaccel.Trainer(make_gan, strategy=tf.distribute.get_strategy(), methods=none)
    history = trainer.fit(gan_data(), epochs=1, verbose=1).history
    assert sorted(history) == ["d_loss", "g_loss"]
    # The settings table says the model's own step runs.
    assert "GAN.train_step overridden" in capsys.readouterr().out
    row = trainer.settings["train_step"]
    assert "as in model.fit" in row and "model.jit_compile" in row
    assert trainer.settings["jit_compile"] is False  # the model's: Keras's "auto" on a CPU


def test_a_model_not_compiled_is_refused():
    with pytest.raises(ValueError, match=r"not compiled.*model\.compile"):
        tfaccel.Trainer(GAN(), strategy=tf.distribute.get_strategy())


def test_a_model_built_outside_the_scope_is_refused(mirrored):
    with pytest.raises(ValueError, match=r"outside the strategy's scope.*Trainer\(build_model"):
        tfaccel.Trainer(make_gan(), strategy=mirrored)


def test_which_hooks_are_overridden():
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    assert model_steps.overridden(plain) == []
    assert model_steps.of(plain) is None
    assert model_steps.overridden(make_gan()) == ["train_step"]
    assert model_steps.overridden(make_classifier(CustomLoss)) == ["compute_loss"]
    plain.test_step = lambda data: {}  # on the object, not the class
    assert model_steps.overridden(plain) == ["test_step"]


def test_jit_compile_auto_follows_the_models_compile_setting():
    data = tf.data.Dataset.from_tensor_slices((X[:64], Y[:64])).batch(16, drop_remainder=True)

    def make():
        model = make_classifier(CustomLoss)
        model.compile(
            keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", jit_compile=True
        )
        return model

    reference = make()
    reference.fit(data, epochs=2, verbose=0, shuffle=False)
    trainer = tfaccel.Trainer(make, strategy=tf.distribute.get_strategy())
    assert trainer.jit_compile is True  # the model's setting, as model.fit runs it
    trainer.fit(data, epochs=2, verbose=0)
    assert max_diff(reference.get_weights(), trainer.model.get_weights()) < 1e-5


def test_arrays_without_labels_name_the_dataset_a_gan_takes():
    trainer = tfaccel.Trainer(make_gan, strategy=tf.distribute.get_strategy())
    with pytest.raises(ValueError, match=r"its own train_step takes a batched dataset"):
        trainer.fit(REAL, epochs=1, verbose=0)


class DrawnGAN(GAN):
    """The GAN drawing its noise in train_step from a seed generator (state of its own)."""

    def __init__(self):
        super().__init__()
        self.seed = keras.random.SeedGenerator(11)

    def train_step(self, data):
        noise = keras.random.normal((tf.shape(data)[0], 4), seed=self.seed)
        return super().train_step((data, noise))


def test_noise_drawn_in_train_step_equals_model_fit_and_resumes_exactly(tmp_path):
    def make():
        keras.utils.set_random_seed(5)
        gan = DrawnGAN()
        gan.compile(keras.optimizers.Adam(1e-2), keras.optimizers.SGD(0.1))
        return gan

    def data():
        return tf.data.Dataset.from_tensor_slices(REAL).batch(16)

    def fresh():
        return tfaccel.Trainer(make, strategy=tf.distribute.get_strategy(), steps_per_loop=1)

    reference = make()
    reference.fit(data(), epochs=2, verbose=0, shuffle=False)
    whole = fresh()
    whole.fit(data(), epochs=2, verbose=0)
    assert max_diff(reference.get_weights(), whole.model.get_weights()) < 1e-5
    fresh().fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path, callbacks=[StopAt(7)])
    resumed = fresh()
    resumed.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    # The seed generator's state came back too: the same noise after the resume.
    assert max_diff(whole.model.get_weights(), resumed.model.get_weights()) == 0.0


def test_the_doctor_on_a_model_with_its_own_step_says_what_it_cannot_time(monkeypatch):
    from tfaccel.choices import policy

    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"avx512_bf16"}))  # 2 policies
    trainer = tfaccel.Trainer(
        lambda: make_classifier(CustomLoss), strategy=tf.distribute.get_strategy()
    )
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10)
    trainer.fit(data, epochs=1, verbose=0)
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=2, rounds=1, deep=True)
    text = str(report)
    assert "Precision: not measured (the model runs its own train_step" in text
    assert "XLA (deep=True): not measured (the model runs its own train_step" in text
    assert "set_global_policy" in text
