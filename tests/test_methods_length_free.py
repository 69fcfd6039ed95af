"""methods.adaptive.Plateau: a warm-up over the first epoch, then a loss-driven decay; the
rate at each step does not depend on the declared epochs, and its decay resumes. "fast" as a
whole: its stack, rate and batch stages are the same whatever the epochs declared."""

import math
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_methods_trainer import StopAfter, Y, build, dataset, max_diff, trainer

import tfaccel
from tfaccel import methods
from tfaccel.methods.adaptive.plateau import Plateau, PlateauCycle, PlateauDecay
from tfaccel.methods.base import schedule_of
from tfaccel.methods.composition import plan_for


def plan(epochs, method, batch=16):
    return methods.for_fit(
        [method],
        build(),
        dataset(batch),
        epochs=epochs,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(1e-3),
    )


def rate(schedule, step):
    return float(schedule(tf.constant(step, tf.int64)))


@pytest.mark.parametrize("declared", [3, 30, 150])
def test_the_rate_at_chosen_steps_is_the_hand_computed_one_whatever_the_declared_epochs(declared):
    made = plan(declared, Plateau(scale=10.0, warmup=0.5))  # 64 rows / 16: 4 steps an epoch
    schedule = made.methods[0].schedule
    peak = 1e-3 * math.sqrt(16 / 32) * 10.0  # the one-cycle's peak rule
    assert isinstance(schedule, PlateauCycle) and made.optimizer.learning_rate is not None
    assert rate(schedule, 0) == pytest.approx(peak / 25, rel=1e-6)  # warm-up: 2 steps
    assert rate(schedule, 1) == pytest.approx(peak / 25 + (peak - peak / 25) / 2, rel=1e-6)
    for step in (2, 3, 40, 10_000, 1_000_000):
        assert rate(schedule, step) == pytest.approx(peak, rel=1e-6)
    schedule.factor.assign(0.25)
    assert rate(schedule, 10_000) == pytest.approx(peak / 4, rel=1e-6)


def test_warmup_steps_override_the_share_of_the_first_epoch():
    schedule = plan(5, Plateau(peak=0.01, warmup_steps=8, div=10.0)).methods[0].schedule
    assert rate(schedule, 4) == pytest.approx(0.001 + 0.009 * 4 / 8, rel=1e-6)
    assert rate(schedule, 8) == pytest.approx(0.01, rel=1e-6)


class Rates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.seen.append(float(optimizer.learning_rate))


def fitted_rates(declared):
    """model.fit declared `declared` epochs, stopped after 3: the rate at each step."""
    made = plan(declared, Plateau(scale=30.0, warmup=0.75, monitor="loss"))
    model = made.methods[0]._job.model
    model.compile(made.optimizer, made.loss)
    rates = Rates()
    model.fit(
        made.dataset, epochs=declared, callbacks=[*made.callbacks, rates, StopAfter(3)], verbose=0
    )
    return rates.seen, float(made.methods[0].schedule.factor.numpy())


def test_model_fit_follows_the_same_rates_declared_3_or_100_epochs():
    short, factor_short = fitted_rates(3)
    long, factor_long = fitted_rates(100)
    assert len(short) == len(long) == 12
    np.testing.assert_allclose(short, long, rtol=1e-6)
    assert factor_short == factor_long
    peak = 1e-3 * math.sqrt(16 / 32) * 30.0
    assert short[0] == pytest.approx(peak / 25, rel=1e-5)
    assert short[3] == pytest.approx(peak, rel=1e-5)  # 3 warm-up steps of the first epoch's 4


def test_the_plateau_rule_by_hand():
    method = Plateau(patience=1, factor=0.5, min_delta=0.0, min_factor=0.1)
    schedule = plan(3, method).methods[0].schedule
    factors = []
    for loss in (1.0, 0.9, 0.95, 0.95, 0.8, 0.85, 0.85, 0.85, 0.85):
        method.step(schedule, loss)
        factors.append(float(schedule.factor.numpy()))
    assert factors == pytest.approx([1, 1, 0.5, 0.25, 0.25, 0.125, 0.1, 0.1, 0.1])
    patient = Plateau(patience=2, factor=0.5, min_delta=0.1)
    schedule = plan(3, patient).methods[0].schedule
    for loss in (1.0, 0.95, 0.95, 0.85, 0.8):  # 0.95 and 0.8: within 10 % of the best
        patient.step(schedule, loss)
    assert float(schedule.factor.numpy()) == pytest.approx(0.5)
    assert int(schedule.wait.numpy()) == 1
    patient.step(schedule, 0.79)
    assert float(schedule.factor.numpy()) == pytest.approx(0.25)
    assert float(schedule.best.numpy()) == pytest.approx(0.85)


def test_the_monitor_reads_val_loss_when_the_epoch_has_it():
    method = Plateau()
    assert method.monitored({"loss": 1.0, "val_loss": 2.0}) == 2.0
    assert method.monitored({"loss": 1.0}) == 1.0
    assert Plateau(monitor="loss").monitored({"loss": 1.0, "val_loss": 2.0}) == 1.0
    assert method.monitored({"val_loss": float("nan")}) is None


def test_the_decay_state_is_saved_with_the_optimizer(tmp_path):
    made = plan(3, Plateau())
    schedule = made.methods[0].schedule
    model = made.methods[0]._job.model
    made.optimizer.build(model.trainable_variables)
    schedule.factor.assign(0.125)
    schedule.best.assign(0.5)
    schedule.wait.assign(1)
    path = tf.train.Checkpoint(optimizer=made.optimizer).write(str(tmp_path / "ck"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("plateau_factor" in n or "_learning_rate/factor" in n for n in names), names
    schedule.factor.assign(1.0)
    schedule.wait.assign(0)
    tf.train.Checkpoint(optimizer=made.optimizer).read(path).expect_partial()
    assert float(schedule.factor.numpy()) == 0.125 and int(schedule.wait.numpy()) == 1


def test_the_decay_stays_saved_under_the_progressive_batch_s_scaling(tmp_path):
    model = build()
    made = methods.for_fit(
        [methods.ProgressiveBatch(growth=2, stages=2), Plateau()],
        model,
        dataset(8),
        epochs=4,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(1e-3),
    )
    schedule = made.methods[-1].schedule
    assert made.optimizer.learning_rate is not None and schedule is not None
    made.optimizer.build(model.trainable_variables)
    path = tf.train.Checkpoint(optimizer=made.optimizer).write(str(tmp_path / "ck"))
    assert any("plateau" in name for name, _ in tf.train.list_variables(path))


def stalling():
    return [Plateau(peak=0.5, warmup_steps=2, monitor="loss", min_delta=0.05)]


def test_the_trainer_resumes_its_decay_to_the_uninterrupted_weights(tmp_path):
    whole = trainer(stalling())
    whole.fit(dataset(), epochs=5, verbose=0)
    assert any(isinstance(c, PlateauDecay) for c in whole.methods.plan.callbacks)
    factor = float(whole.methods.plan.methods[0].schedule.factor.numpy())
    assert factor < 1.0  # the rule fired: the resume below has a decay to restore
    first = trainer(stalling())
    first.fit(dataset(), epochs=5, callbacks=[StopAfter(2)], checkpoint_dir=tmp_path, verbose=0)
    resumed = trainer(stalling())
    resumed.fit(dataset(), epochs=5, checkpoint_dir=tmp_path, verbose=0)
    assert float(resumed.methods.plan.methods[0].schedule.factor.numpy()) == factor
    assert max_diff(whole.model.get_weights(), resumed.model.get_weights()) < 1e-6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scale": 0}, "scale must be a positive"),
        ({"warmup": 1.5}, r"warmup must be a share of the first epoch in \[0, 1\]"),
        ({"warmup_steps": -1}, "warmup_steps must be an int >= 0"),
        ({"factor": 1.0}, r"factor must be in \(0, 1\)"),
        ({"patience": 0}, "patience must be an int >= 1"),
        ({"monitor": "accuracy"}, "monitor must be one of"),
        ({"div": 0.5}, "div must be a number >= 1"),
        ({"min_delta": -1}, "min_delta must be >= 0"),
    ],
)
def test_bad_arguments_say_what_is_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Plateau(**kwargs)


def test_the_settings_table_says_it_has_no_end_date():
    made = plan(150, Plateau(scale=10.0, warmup=0.5))
    assert "warm-up over 2 steps" in made.describe() and "no end date" in made.describe()


def test_a_user_s_reduce_lr_on_plateau_multiplies_the_length_free_rate():
    """Keras' ReduceLROnPlateau halves the rate at every epoch's end but the first (it can
    never see an improvement of 1e9); Plateau's own decay never fires (patience 100)."""
    made = plan(4, Plateau(peak=0.01, warmup_steps=0, patience=100))
    model = made.methods[0]._job.model
    model.compile(made.optimizer, made.loss)
    rates = Rates()
    halving = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9
    )
    model.fit(made.dataset, epochs=4, callbacks=[*made.callbacks, halving, rates], verbose=0)
    want = [0.01 * f for f in (1, 1, 1, 1, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25)]
    np.testing.assert_allclose(rates.seen, want, rtol=1e-5)
    assert float(made.methods[0].schedule.factor.numpy()) == 1.0


def test_its_own_decay_stands_down_once_a_user_s_callback_set_the_rate():
    method = Plateau(patience=1, min_delta=0.0)
    made = plan(3, method)
    decay = next(c for c in made.callbacks if isinstance(c, PlateauDecay))
    for loss in (1.0, 1.0):
        decay.on_epoch_end(0, {"loss": loss})
    assert float(method.schedule.factor.numpy()) == 0.5  # its own rule: a stalled epoch
    method.schedule.callback_factor.assign(0.1)  # a ReduceLROnPlateau of the user's
    for loss in (1.0, 1.0, 1.0):
        decay.on_epoch_end(0, {"loss": loss})
    assert float(method.schedule.factor.numpy()) == 0.5


def test_the_schedule_serializes_as_made_and_a_saved_model_loads(tmp_path):
    made = plan(3, Plateau(scale=10.0, warmup=0.5))
    schedule = made.methods[0].schedule
    schedule.factor.assign(0.5)  # training state: not in the config (a schedule as made)
    copy = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(copy) is PlateauCycle and float(copy.factor.numpy()) == 1.0
    assert [rate(copy, s) for s in (0, 1, 5)] == [rate(schedule, s) * 2 for s in (0, 1, 5)]
    model = made.methods[0]._job.model
    model.compile(made.optimizer, made.loss)
    model.fit(made.dataset, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer._learning_rate, PlateauCycle)


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# -- "fast" as a whole: its stack, rate and batch do not move with the declared epochs ----

FIRST_EPOCHS = 12


def fast_plan(kind, declared, steps):
    """`plan_for("fast")` on a job of `steps` steps an epoch at batch 16, `declared` epochs."""
    job = methods.Job(
        build(),
        "sparse_categorical_crossentropy",
        keras.optimizers.Adam(1e-3),
        dataset().element_spec,
        declared,
        steps,
        16,
    )
    return plan_for("fast", job, kind=kind)


def seen(made, steps):
    """The stack, the rate at chosen steps and the batch of the first epochs."""
    schedule = schedule_of(made.optimizer)
    grown = [m for m in made.methods if isinstance(m, methods.ProgressiveBatch)]
    factors = [grown[0].callback.factor_at(e) for e in range(FIRST_EPOCHS)] if grown else []
    chosen = (0, 1, steps // 2, steps, 3 * steps, 40 * steps)
    rates = [rate(schedule, s) for s in chosen] if schedule is not None else []
    stack = [re.sub(" at 0x[0-9a-f]+", "", repr(m)) for m in made.methods]  # the settings
    return stack, rates, factors


@pytest.mark.parametrize(
    ("kind", "scale", "batches"),
    [
        ("image", 10.0, [1, 1, 2, 4] + [8] * 8),  # 8x, stages over the first 4 epochs
        ("sequence", 3.0, [1, 2] + [4] * 10),  # 4x over the first 2 epochs
        ("tabular", 3.0, [1, 1, 1, 2, 2, 2, 4, 4] + [8] * 4),  # 8x over the first 8 epochs
    ],
)
def test_fast_is_the_same_whether_3_30_or_150_epochs_are_declared(kind, scale, batches):
    steps = methods.LONG_EPOCH_STEPS  # a long job: the batch grows
    stack, rates, factors = seen(fast_plan(kind, 3, steps), steps)
    for declared in (30, 150):
        assert seen(fast_plan(kind, declared, steps), steps) == (stack, rates, factors)
    assert factors == batches
    peak = 1e-3 * math.sqrt(16 / 32) * scale  # warm-up over the first epoch, then held
    assert rates[0] == pytest.approx(peak / 25, rel=1e-6)
    assert rates[2] == pytest.approx(peak / 25 + (peak - peak / 25) * 0.5, rel=1e-6)
    assert rates[3:] == pytest.approx([peak] * 3, rel=1e-6)


@pytest.mark.parametrize("kind", ["sequence", "tabular"])
def test_a_short_job_s_stack_is_the_same_at_any_declared_length(kind):
    steps = methods.LONG_EPOCH_STEPS - 1
    short = seen(fast_plan(kind, 3, steps), steps)
    assert all(seen(fast_plan(kind, d, steps), steps) == short for d in (30, 150, 10_000))
    assert not short[2]  # no growth


def test_the_trainer_s_batch_stages_are_the_same_declared_5_or_50_epochs():
    images = np.random.default_rng(0).normal(size=(64, 8, 8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((images, Y)).batch(8)  # 8 steps an epoch
    rows = []
    for declared in (5, 50):
        keras.utils.set_random_seed(0)
        net = keras.Sequential(
            [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
        )
        ours = tfaccel.Trainer(net, optimizer="adam", loss=LOSS, methods="fast")
        ours.fit(data, epochs=declared, callbacks=[StopAfter(1)], verbose=0)
        rows.append(ours.settings["batch_stages"])
    stages = "8 (epochs 1-2, 8 steps each) -> 16 (epoch 3, 4 steps each) -> 32 (epoch 4, 2 steps"
    assert rows[0].startswith(f"{stages} each) -> 64 (epoch 5, 1 step each)")
    assert rows[1].startswith(f"{stages} each) -> 64 (epochs 5-50, 1 step each)")


def test_the_old_long_job_name_says_its_replacement():
    with pytest.raises(AttributeError, match="LONG_EPOCH_STEPS"):
        methods.LONG_JOB_STEPS  # noqa: B018
