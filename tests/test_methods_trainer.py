"""tfaccel.methods in the Trainer: the same numbers as model.fit, the settings table,
exact resume with the stateful methods on, errors before step 1."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import methods

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 6)).astype("float32")
Y = RNG.integers(0, 3, size=64).astype("int32")


def build(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


def dataset(batch=16):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch)


def deterministic():
    return [methods.LabelSmoothing(0.1), methods.OneCycle(peak=0.05)]


def max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


def trainer(chosen, **kwargs):
    return tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
        jit_compile=False,
        methods=chosen,
        **kwargs,
    )


def test_trainer_path_equals_model_fit_path_for_label_smoothing_and_schedule():
    reference = build()
    plan = methods.for_fit(
        deterministic(),
        reference,
        dataset(),
        epochs=3,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.SGD(0.1),
    )
    reference.compile(plan.optimizer, plan.loss, metrics=["accuracy"])
    expected = reference.fit(
        plan.dataset,
        epochs=3,
        validation_data=plan.evaluation_data(dataset()),
        callbacks=plan.callbacks,
        verbose=0,
    ).history
    ours = trainer(deterministic())
    history = ours.fit(dataset(), epochs=3, validation_data=dataset(), verbose=0).history
    assert max_diff(reference.get_weights(), ours.model.get_weights()) < 1e-5
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["val_accuracy"], expected["val_accuracy"], rtol=1e-5)
    np.testing.assert_allclose(history["val_loss"], expected["val_loss"], rtol=1e-5)
    assert "batch_size" not in history and "batch_size" not in expected  # no batch grown
    assert ours.settings["method: label smoothing"].startswith("the loss")
    assert ours.settings["method: one-cycle"].startswith("the learning rate")
    got = ours.evaluate(dataset())  # sparse labels, one-hot'ed as in training
    want = reference.evaluate(plan.evaluation_data(dataset()), verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


def test_settings_table_names_each_method_and_what_fast_dropped(capsys):
    images = tf.data.Dataset.from_tensor_slices(
        (RNG.normal(size=(64, 4, 4, 1)).astype("float32"), Y)
    ).batch(16)
    ours = tfaccel.Trainer(
        lambda: keras.Sequential(
            [keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        methods="fast",
        accumulate_steps=2,  # the batch is not grown under accumulation: dropped, said
    )
    ours.fit(images, epochs=2, verbose=1)
    table = capsys.readouterr().out
    names = [m.name for m in ours.methods.plan.methods]
    assert names == ["plateau", "label smoothing"]
    assert all(f"method: {name}" in table for name in [*names, "fast", "progressive batch"])
    assert "accumulate_steps=1" in ours.settings["method: progressive batch"]  # saying why


def counting_runner_rebuilds(made):
    """Counts the Trainer's runner rebuilds from now on."""
    rebuilt = []
    make = made._make_runner
    made._make_runner = lambda *args: (rebuilt.append(args), make(*args))[1]
    return rebuilt


def test_fast_on_a_short_table_applies_no_method_and_says_so():
    ours = trainer("fast")
    ours_rebuilt = counting_runner_rebuilds(ours)
    history = ours.fit(dataset(), epochs=2, verbose=0).history
    assert ours.methods.plan.methods == []
    assert ours.settings["method: fast"].startswith("no method: none measured faster")
    reference = trainer(None)
    reference_rebuilt = counting_runner_rebuilds(reference)
    want = reference.fit(dataset(), epochs=2, verbose=0).history
    assert len(ours_rebuilt) == len(reference_rebuilt)  # no method: the runner stands
    assert history["loss"] == want["loss"]  # trained as given
    assert max_diff(ours.model.get_weights(), reference.model.get_weights()) == 0


class StopAfter(keras.callbacks.Callback):
    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.epochs:
            self.model.stop_training = True


def with_ema():
    return [methods.OneCycle(peak=0.05), methods.EMA(0.8), methods.LabelSmoothing(0.1)]


def with_freezing():
    return [
        methods.WarmupCosine(peak=0.05),
        methods.LayerFreezing(start=0.5, fraction=0.5),
        methods.MixUp(0.4),
    ]


@pytest.mark.parametrize("stack", [with_ema, with_freezing], ids=["ema", "freezing-mixup"])
def test_resume_with_stateful_methods_gives_the_uninterrupted_weights(stack, tmp_path):
    whole = trainer(stack())
    whole.fit(dataset(), epochs=4, verbose=0)
    first = trainer(stack())
    first.fit(dataset(), epochs=4, callbacks=[StopAfter(1)], checkpoint_dir=tmp_path, verbose=0)
    assert int(first.step) == 4
    resumed = trainer(stack())
    resumed.fit(dataset(), epochs=4, checkpoint_dir=tmp_path, verbose=0)
    assert int(resumed.step) == 16
    assert max_diff(whole.model.get_weights(), resumed.model.get_weights()) < 1e-6
    assert not np.allclose(first.model.get_weights()[0], resumed.model.get_weights()[0])


def test_ema_and_freezing_do_not_stack():
    plan = methods.for_fit(
        [methods.EMA(0.9), methods.LayerFreezing()],
        build(),
        dataset(),
        epochs=4,
        loss="sparse_categorical_crossentropy",
    )
    assert [m.name for m in plan.methods] == ["ema"]
    assert "trainable variable" in dict(plan.dropped)["layer freezing"]


def test_ema_in_the_trainer_evaluates_and_saves_the_averages(tmp_path):
    ours = trainer([methods.EMA(0.5)])
    weights = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: weights.append(ours.model.layers[0].kernel.numpy())
    )
    ours.fit(dataset(), epochs=1, callbacks=[record], verbose=0)
    ours_steps = int(ours.step)
    assert ours_steps == 4 and len(weights) == 2  # two loops of 2 steps
    path = ours.save(str(tmp_path / "m.keras"))
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.layers[0].kernel.numpy(), ours.model.layers[0].kernel)
    averages = ours.optimizer._model_variables_moving_average
    np.testing.assert_allclose(ours.model.layers[0].kernel.numpy(), averages[0].numpy())
    assert not np.allclose(ours.model.layers[0].kernel.numpy(), weights[-1])


def test_bad_methods_raise_before_step_one():
    with pytest.raises(ValueError, match="'fast', 'none'"):
        trainer("fastest")
    ours = tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.1),
        loss="mse",
        strategy=tf.distribute.get_strategy(),
        methods=[methods.MixUp(0.2)],
    )
    data = tf.data.Dataset.from_tensor_slices((X, RNG.normal(size=(64, 3)).astype("float32")))
    with pytest.raises(ValueError, match="regression loss"):
        ours.fit(data.batch(16), epochs=1, verbose=0)
    assert int(ours.step) == 0
    long = trainer([methods.WarmupCosine(steps=1000)])
    with pytest.raises(ValueError, match="longer than the job"):
        long.fit(dataset(), epochs=2, verbose=0)
    assert int(long.step) == 0


def test_two_replicas_train_as_one_with_methods_on(mirrored):
    def stack():
        return [methods.OneCycle(peak=0.05), methods.EMA(0.8), methods.MixUp(0.4)]

    one = trainer(stack())
    one.fit(dataset(), epochs=2, validation_data=dataset(), verbose=0)
    two = tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=mirrored,
        steps_per_loop=2,
        jit_compile=False,
        methods=stack(),
    )
    history = two.fit(dataset(), epochs=2, validation_data=dataset(), verbose=0).history
    assert max_diff(one.model.get_weights(), two.model.get_weights()) < 1e-5
    assert 0.0 <= history["val_accuracy"][-1] <= 1.0


def test_progressive_resizing_in_the_trainer_resumes_at_its_stage(tmp_path):
    """The stage is a function of the epoch, so a resumed run is at the same stage. (Not
    bit-exact: the Trainer's input stream reads a batch or two ahead, which may get the
    previous stage's size at a stage change; model.fit's per-epoch iterator does not.)"""
    images = RNG.normal(size=(32, 8, 8, 1)).astype("float32")
    labels = RNG.integers(0, 3, size=32).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)

    def image_model():
        keras.utils.set_random_seed(2)
        return keras.Sequential(
            [
                keras.Input((None, None, 1)),
                keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )

    def make():
        return tfaccel.Trainer(
            image_model,
            optimizer=keras.optimizers.SGD(0.1),
            loss="sparse_categorical_crossentropy",
            strategy=tf.distribute.get_strategy(),
            steps_per_loop=2,
            jit_compile=False,
            methods=[methods.ProgressiveResizing(start=0.5, stages=2, until=0.5)],
        )

    whole = make()
    whole.fit(data, epochs=4, verbose=0)
    assert whole.methods.plan.methods[0].callback.seen == [4, 4, 8, 8]
    first = make()
    first.fit(data, epochs=4, callbacks=[StopAfter(1)], checkpoint_dir=tmp_path, verbose=0)
    resumed = make()
    resumed.fit(data, epochs=4, checkpoint_dir=tmp_path, verbose=0)
    assert resumed.methods.plan.methods[0].callback.seen == [4, 8, 8]
    assert int(resumed.step) == 16


JOB = """
import os, signal, sys
import numpy as np, keras, tensorflow as tf
import tfaccel
from tfaccel import methods

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = rng.integers(0, 3, size=64).astype("int32")
data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1).batch(16)
        .prefetch(tf.data.AUTOTUNE))
directory, kill_at, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


class Kill(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print("started at step", int(trainer.step), flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if kill_at and int(trainer.step) >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


trainer = tfaccel.Trainer(
    build, optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
    strategy=tf.distribute.get_strategy(), steps_per_loop=2, jit_compile=False,
    methods=[methods.OneCycle(peak=0.05), methods.EMA(0.8), methods.MixUp(0.4)],
)
trainer.fit(data, epochs=4, callbacks=[Kill()], checkpoint_dir=directory or None,
            checkpoint_every=2, verbose=0)
np.save(out, np.concatenate([w.ravel() for w in trainer.model.get_weights()]))
"""


def test_kill_9_mid_epoch_with_methods_on_resumes_to_the_uninterrupted_weights(tmp_path, jobs):
    """One-cycle and EMA (optimizer state) and MixUp (a batch map) on the pattern users
    write, a reshuffling `shuffle`, then `batch` and `prefetch`: killed mid-epoch, the
    resumed run's later epochs keep the uninterrupted run's orders (tf.data's buffered
    iterator checkpoint restored the shuffle's seeds epochs ahead; the Trainer saves
    the stream symbolically, `Feed.symbolic`)."""
    import signal
    import sys

    script = tmp_path / "job.py"
    script.write_text(JOB)

    def job(directory, kill_at, out):
        args = [sys.executable, str(script), directory, str(kill_at), str(tmp_path / out)]
        return jobs.run(args, timeout=300)  # a process of its own (conftest.py)

    whole = job("", 0, "whole.npy")
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed = job(str(tmp_path / "ckpt"), 5, "never.npy")  # at step 6 of 16: mid-epoch 1
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = job(str(tmp_path / "ckpt"), 0, "resumed.npy")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    started = int(resumed.stdout.split("started at step")[1].split()[0])
    assert 0 < started < 8  # from a checkpoint before the kill (every 2 steps, saved async)
    want, got = np.load(tmp_path / "whole.npy"), np.load(tmp_path / "resumed.npy")
    assert float(np.max(np.abs(want - got))) < 1e-6
