"""methods.ProgressiveBatch in the Trainer (issue 68, item 4): each epoch's batches grown by
its stage's factor (hand-counted examples per step), one trace for all stages, the same
training as model.fit through methods.for_fit, 1 and 2 replicas alike, kill -9 / resume
exact mid-stage, old checkpoints read, bad combinations refused before step 1."""

import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_methods_trainer import build, max_diff

import tfaccel
from tfaccel import methods
from tfaccel.train.state.batch_stages import BatchStages

RNG = np.random.default_rng(5)
X = RNG.normal(size=(60, 6)).astype("float32")  # 60 = 7 batches of 8 and one of 4
Y = RNG.integers(0, 3, size=60).astype("int32")
LOSS = "sparse_categorical_crossentropy"


def dataset(shuffled=False):
    data = tf.data.Dataset.from_tensor_slices((X, Y))
    return (data.shuffle(60, seed=4) if shuffled else data).batch(8)


def grown():
    """Batch 8 -> 16 -> 32: stages over the first half of 4 epochs, x4 from epoch 3."""
    return [methods.ProgressiveBatch(final=32, stages=3, until=0.5), methods.OneCycle(peak=0.05)]


def trainer(strategy=None, model=build, **kwargs):
    return tfaccel.Trainer(
        model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        strategy=strategy or tf.distribute.get_strategy(),
        steps_per_loop=1,
        jit_compile=False,
        **{"methods": grown(), **kwargs},
    )


class Examples(keras.callbacks.Callback):
    """The examples of each step, per epoch (the loss tracker's count; one step a loop)."""

    def __init__(self, ours):
        super().__init__()
        self.ours, self.epochs = ours, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append([])
        self.before = 0

    def on_train_batch_end(self, batch, logs=None):
        count = int(self.ours.runner.loss_tracker.count.numpy())
        self.epochs[-1].append(count - self.before)
        self.before = count


# Hand-counted: 60 examples an epoch in batches of 8 (the last 4), regrouped by 1, 2, 4, 4.
EXAMPLES = [[8] * 7 + [4], [16, 16, 16, 12], [32, 28], [32, 28]]


@pytest.mark.parametrize("two", [False, True], ids=["1 replica", "2 replicas"])
def test_each_epoch_trains_every_example_once_in_its_stage_batch(two, mirrored):
    ours = trainer(mirrored if two else None)
    seen = Examples(ours)
    ours.fit(dataset(), epochs=4, callbacks=[seen], verbose=0)
    assert seen.epochs == EXAMPLES
    assert ours.methods.plan.methods[0].callback.seen == [1, 2, 4, 4]
    # The schedule was sized to the steps the stages make, and the Trainer made them.
    assert ours.methods.plan.job.epoch_steps == (8, 4, 2, 2)
    assert int(ours.runner.position.step) == ours.methods.plan.job.total_steps == 16
    traces = ours.runner.loops.traces["train loop"]
    assert 1 <= traces <= 3  # at most one a stage (one input stream: once)
    row = ours.settings["batch_stages"]
    assert row.startswith("8 (epoch 1, 8 steps each) -> 16 (epoch 2, 4 steps each) -> 32")
    assert "3 stage(s)" in row and "traced once" in row


def test_two_replicas_train_as_one(mirrored):
    one, two = trainer(), trainer(mirrored)
    one.fit(dataset(shuffled=True), epochs=4, verbose=0)
    two.fit(dataset(shuffled=True), epochs=4, verbose=0)
    assert max_diff(one.model.get_weights(), two.model.get_weights()) < 1e-5


def test_the_trainer_trains_what_model_fit_trains_through_for_fit(tmp_path):
    """The same examples in each step: equal weights and losses to model.fit's, with a
    partial last batch (regrouped per epoch, square-root rate, one-cycle sized to the
    stages' steps). Unshuffled: for_fit's regrouping (a `flat_map` around the data) draws
    another order from a seeded reshuffling `shuffle` than the data's own, which the
    Trainer keeps (as plain model.fit reads it)."""
    reference = build()
    plan = methods.for_fit(
        grown(), reference, dataset(), epochs=4, loss=LOSS, optimizer=keras.optimizers.SGD(0.1)
    )
    reference.compile(plan.optimizer, plan.loss)
    board = keras.callbacks.TensorBoard(str(tmp_path / "fit"))
    callbacks = [*plan.callbacks, board]
    expected = reference.fit(plan.dataset, epochs=4, callbacks=callbacks, verbose=0)
    ours = trainer()
    board = keras.callbacks.TensorBoard(str(tmp_path / "trainer"))  # before the methods'
    history = ours.fit(dataset(), epochs=4, callbacks=[board], verbose=0)
    assert max_diff(reference.get_weights(), ours.model.get_weights()) < 1e-6
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    # Each epoch's stage batch in the logs: 8 x the factors 1, 2, 4, 4 (grown()'s stages).
    assert history.history["batch_size"] == expected.history["batch_size"] == [8, 16, 32, 32]
    for run in ("fit", "trainer"):
        assert scalars(tmp_path / run / "train", "epoch_batch_size") == [8, 16, 32, 32]


def normalized():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(momentum=0.9, name="norm"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


def test_batch_norm_statistics_follow_the_growth_as_in_model_fit():
    """Momentum 0.9 ** 4 while the batch grows 4x, in both paths: the same moving
    statistics as model.fit through for_fit; the user's 0.9 back after the fit."""
    reference = normalized()
    plan = methods.for_fit(
        grown(), reference, dataset(), epochs=4, loss=LOSS, optimizer=keras.optimizers.SGD(0.1)
    )
    reference.compile(plan.optimizer, plan.loss)
    reference.fit(plan.dataset, epochs=4, callbacks=plan.callbacks, verbose=0)
    ours = trainer(model=normalized)
    momenta = []

    class Momentum(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            momenta.append(ours.model.get_layer("norm").momentum)

        def on_epoch_end(self, epoch, logs=None):  # after the method's: the user's again
            momenta.append(("end", ours.model.get_layer("norm").get_config()["momentum"]))

    ours.fit(dataset(), epochs=4, callbacks=[Momentum()], verbose=0)
    assert set(momenta) == {0.9**4, ("end", 0.9)}
    moving = [reference.get_layer("norm").moving_mean, ours.model.get_layer("norm").moving_mean]
    np.testing.assert_allclose(*[m.numpy() for m in moving], rtol=1e-5, atol=1e-6)
    assert max_diff(reference.get_weights(), ours.model.get_weights()) < 1e-5
    assert ours.model.get_layer("norm").momentum == reference.get_layer("norm").momentum == 0.9
    row = ours.settings["method: progressive batch"]
    assert "BatchNorm momentum 0.9 -> 0.656 on 1 layer (^4)" in row


def scalars(folder, tag):
    """The values a TensorBoard event file in `folder` holds for `tag`, in step order."""
    found = {}
    for path in folder.glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return [found[step] for step in sorted(found)]


def test_fast_grows_the_batch_of_an_image_job_in_the_trainer():
    images = RNG.normal(size=(64, 8, 8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((images, RNG.integers(0, 3, 64))).batch(8)
    net = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    ours = tfaccel.Trainer(
        net,
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        methods="fast",
    )
    ours.fit(data, epochs=5, verbose=0)
    names = [m.name for m in ours.methods.plan.methods]
    assert "progressive batch" in names and not ours.methods.plan.dropped
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fit = methods.for_fit("fast", keras.models.clone_model(net), data, epochs=5, loss=loss)
    assert names == [m.name for m in fit.methods]  # for_fit's stack
    # x8 in 4 stages over the first 4 epochs (ramp_epochs, whatever is declared)
    assert ours.settings["batch_stages"].startswith(
        "8 (epochs 1-2, 8 steps each) -> 16 (epoch 3, 4 steps each) -> 32 (epoch 4, 2 steps each)"
        " -> 64 (epoch 5, 1 step each)"
    )
    assert int(ours.runner.position.step) == ours.methods.plan.job.total_steps


def test_bad_combinations_are_refused_before_step_one():
    ours = trainer(accumulate_steps=2)
    with pytest.raises(ValueError, match="accumulate_steps=1"):
        ours.fit(dataset(), epochs=4, verbose=0)
    assert int(ours.runner.position.step) == 0
    images = tf.data.Dataset.from_tensor_slices(
        (RNG.normal(size=(16, 8, 8, 1)).astype("float32"), RNG.integers(0, 3, 16))
    ).batch(4)
    net = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    fast = tfaccel.Trainer(net, optimizer="adam", loss=LOSS, methods="fast", accumulate_steps=2)
    with pytest.warns(UserWarning, match="progressive batch dropped"):  # "fast": said
        fast.fit(images, epochs=1, verbose=0)
    assert "accumulate_steps=1" in dict(fast.methods.plan.dropped)["progressive batch"]


def test_a_checkpoint_without_the_stage_record_resumes_by_its_batches(tmp_path):
    """A checkpoint saved without the progressive batch (before it) is read as steps of one
    start batch: 1 epoch of 8 steps, then epochs 2-4 at 16, 32, 32 (4 + 2 + 2 steps)."""
    plain = trainer(methods=None)
    plain.fit(dataset(), epochs=1, checkpoint_dir=tmp_path, verbose=0)
    ours = trainer()
    seen = Examples(ours)
    ours.fit(dataset(), epochs=4, checkpoint_dir=tmp_path, callbacks=[seen], verbose=0)
    assert seen.epochs == EXAMPLES[1:]
    assert int(ours.runner.position.step) == 16
    assert "no stage recorded" in ours.settings["batch stage on resume"]


def test_the_position_is_counted_in_start_batches():
    stages = BatchStages((1, 2, 4), steps_per_epoch=5, batch=8)
    assert [stages.steps_in(e) for e in range(4)] == [5, 3, 2, 2]
    assert stages.batches_before(1, 2) == 9 and stages.batches_before(1, 3) == 10
    record = stages.record(1, 2)
    assert record["examples_read"] == 72 and record["batch"] == 16
    assert stages.resumed(1, 2, record) == (9, 2)
    assert stages.resumed(1, 2, None) == (7, 1)  # 7 start batches: inside group 1 of epoch 1
    moved = dict(record, factor=4)  # the stages moved: on from the batches read
    assert stages.resumed(1, 2, moved) == (9, 2)
    regrouped = stages.regroup(tf.data.Dataset.range(36).batch(8).repeat().skip(7), 7)
    first = [b.numpy().tolist() for b in regrouped.take(3)]
    assert first == [list(range(16, 32)), list(range(32, 36)), list(range(0, 32))]


JOB = """
import os, signal, sys
import numpy as np, keras, tensorflow as tf
import tfaccel
from tfaccel import devices, methods

if sys.argv[4] == "2":
    devices.configure(virtual_cpus=2)
rng = np.random.default_rng(0)
x = rng.normal(size=(60, 6)).astype("float32")
y = rng.integers(0, 3, size=60).astype("int32")
data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60, seed=1).batch(8)
        .prefetch(tf.data.AUTOTUNE))
directory, kill_at, out, replicas = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
strategy = (devices.strategy("mirrored", devices=["/cpu:0", "/cpu:1"]) if replicas == "2"
            else tf.distribute.get_strategy())


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


class Kill(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print("started at step", trainer.runner.position.step, flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if kill_at and trainer.runner.position.step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


trainer = tfaccel.Trainer(
    build, optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
    strategy=strategy, steps_per_loop=1, jit_compile=False,
    methods=[methods.ProgressiveBatch(final=32, stages=3, until=0.5),
             methods.OneCycle(peak=0.05), methods.LabelSmoothing(0.1)],
)
trainer.fit(data, epochs=4, callbacks=[Kill()], checkpoint_dir=directory or None,
            checkpoint_every=1, verbose=0)
np.save(out, np.concatenate([w.ravel() for w in trainer.model.get_weights()]))
"""


def killed_and_resumed(jobs, tmp_path, script, kill_at, *extra):
    """Runs the job `script` (argv: checkpoint dir, kill step, output .npy, *extra) whole,
    then killed with SIGKILL at `kill_at`, then resumed; returns (the whole run's and the
    resumed run's saved arrays, the resumed run's stdout). Each is a process of its own."""
    path = tmp_path / "job.py"
    path.write_text(script)

    def job(directory, kill, out):
        args = [sys.executable, str(path), directory, str(kill), str(tmp_path / out)]
        return jobs.run([*args, *extra], timeout=300)  # a process of its own (conftest.py)

    whole = job("", 0, "whole.npy")
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed = job(str(tmp_path / "ckpt"), kill_at, "never.npy")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = job(str(tmp_path / "ckpt"), 0, "resumed.npy")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    return np.load(tmp_path / "whole.npy"), np.load(tmp_path / "resumed.npy"), resumed.stdout


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_kill_9_mid_stage_resumes_to_the_uninterrupted_weights(replicas, tmp_path, jobs):
    """Killed after global step 11 (epoch 2, the batch of 16: steps 8-11), resumed from
    the save of step 9 or 10 (asynchronous: one may be in flight), mid-stage: the weights
    of the run never killed."""
    want, got, out = killed_and_resumed(jobs, tmp_path, JOB, 11, replicas)
    started = int(out.split("started at step")[1].split()[0])
    assert 8 < started < 12  # mid-epoch 2, in the stage of batch 16
    assert float(np.max(np.abs(want - got))) < 1e-6
