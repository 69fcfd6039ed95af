"""ProgressiveBatch: the stages' batches, the examples kept, the rate's square-root rule,
the schedule sized to the stages' steps, the noise scale as the final batch, and refusals."""

import dataclasses
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import methods

RNG = np.random.default_rng(3)
X = RNG.normal(size=(64, 5)).astype("float32")
Y = RNG.integers(0, 3, size=64).astype("int32")
LOSS = "sparse_categorical_crossentropy"


def model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)]
    )


def data(batch=4, seed=7):
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(64, seed=seed).batch(batch)


def test_stages_double_the_batch_and_keep_every_example_once_per_epoch():
    method = methods.ProgressiveBatch(final=16, stages=3, until=0.5)
    plan = methods.for_fit([method], model(), data(), epochs=8, loss=LOSS)
    assert method.factors == (1, 2, 4)
    sizes = []
    for epoch in range(8):
        method.callback.on_epoch_begin(epoch)
        batches = list(plan.dataset)
        sizes.append(batches[0][0].shape[0])
        seen = np.concatenate([x.numpy() for x, _ in batches])
        assert sorted(map(tuple, seen)) == sorted(map(tuple, X))  # the same 64 examples
    # Stages share the first half of the 8 epochs (2 each), then the final batch.
    assert sizes == [4, 4, 8, 8, 16, 16, 16, 16]
    assert method.callback.seen == [1, 1, 2, 2, 4, 4, 4, 4]


def test_regrouping_joins_consecutive_start_batches():
    plain = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)  # unshuffled: order fixed
    method = methods.ProgressiveBatch(final=8, stages=2, until=0.5)
    plan = methods.for_fit([method], model(), plain, epochs=2, loss=LOSS)
    method.callback.on_epoch_begin(1)  # the final stage: batches of 8 = two of 4
    grouped = [x.numpy() for x, _ in plan.dataset]
    small = [x.numpy() for x, _ in plain]
    assert len(grouped) == 8
    for i, batch in enumerate(grouped):
        np.testing.assert_array_equal(batch, np.concatenate(small[2 * i : 2 * i + 2]))


def test_the_rate_follows_the_square_root_rule_of_the_growth():
    method = methods.ProgressiveBatch(final=16, stages=3, until=0.5)
    plan = methods.for_fit(
        [method], model(), data(), epochs=4, loss=LOSS, optimizer=keras.optimizers.Adam(0.01)
    )
    rate = plan.optimizer.learning_rate  # Keras reads the schedule at the iterations
    schedule = plan.optimizer._learning_rate
    assert isinstance(schedule, methods.batch_growth.ScaledByGrowth)
    for epoch, factor in [(0, 1), (1, 2), (2, 4)]:
        method.callback.on_epoch_begin(epoch)
        assert math.isclose(float(schedule(0)), 0.01 * math.sqrt(factor), rel_tol=1e-6)
    assert rate is not None
    linear = methods.ProgressiveBatch(final=16, rate_power=1.0)
    plan = methods.for_fit([linear], model(), data(), epochs=4, loss=LOSS, optimizer="sgd")
    linear.callback.on_epoch_begin(3)
    assert math.isclose(float(plan.optimizer._learning_rate(0)), 0.01 * 4, rel_tol=1e-6)


def test_one_cycle_is_sized_to_the_steps_the_stages_make():
    growth = methods.ProgressiveBatch(final=16, stages=3, until=0.5)
    cycle = methods.OneCycle(peak=0.1, warmup=0.25)
    plan = methods.for_fit([cycle, growth], model(), data(), epochs=4, loss=LOSS)
    # 64 examples: epochs of 16, 8, 4, 4 steps (batches 4, 8, 16, 16) = 32 steps, not 64.
    assert plan.job.total_steps == 32
    assert [type(m) for m in plan.methods] == [methods.ProgressiveBatch, methods.OneCycle]
    assert cycle.sizes(plan.job) == (8, 24)
    inner = plan.optimizer._learning_rate.rate
    assert math.isclose(float(inner(8)), 0.1, rel_tol=1e-5)  # the peak at the warmup's end


def test_model_fit_trains_through_the_stages_and_counts_the_steps():
    net = model()
    method = methods.ProgressiveBatch(final=16, stages=3, until=0.5)
    plan = methods.for_fit([method], net, data(), epochs=4, loss=LOSS, optimizer="adam")
    net.compile(plan.optimizer, plan.loss)
    sizes = []

    class Batches(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            sizes.append(0)

        def on_train_batch_end(self, batch, logs=None):
            sizes[-1] += 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = net.fit(plan.dataset, epochs=4, callbacks=[*plan.callbacks, Batches()], verbose=0)
    assert len(history.history["loss"]) == 4
    assert sizes == [16, 8, 4, 4]  # 64 examples in batches of 4, 8, 16, 16
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert all(np.isfinite(history.history["loss"]))


def test_the_final_batch_from_a_gradient_noise_scale():
    scale = tfaccel.tuning.NoiseScale(50.0, 1.0, 50.0, 8, 64, 64, 8, 0.1)
    method = methods.ProgressiveBatch(final=scale, stages=3)
    methods.for_fit([method], model(), data(batch=8), epochs=4, loss=LOSS)
    # 50 / 8 = 6.25 -> the nearest power of two, 8; the middle stage 2 ** round(1.5) = 4.
    assert method.factors == (1, 4, 8)
    assert "noise scale" in method.changes and "x8" in method.changes
    assert method.growth(64) == 1  # a noise scale below the batch: no growth
    reported = methods.ProgressiveBatch(final=130.0)  # a find_batch_size report's float
    assert reported.growth(32) == 4 and "B_simple ≈ 130" in reported._source()
    assert methods.ProgressiveBatch(final=math.inf).growth(32) == 64  # unbounded: the most


def test_without_a_final_batch_it_grows_by_growth_in_its_stages():
    method = methods.ProgressiveBatch(growth=8, stages=4, until=0.4)
    methods.for_fit([method], model(), data(batch=4), epochs=10, loss=LOSS)
    assert method.factors == (1, 2, 4, 8) and "x8" in method.changes
    assert "final: 8x the start" in method.changes
    # the first three stages share the first 40 % of the 10 epochs; x8 from epoch 4 on
    assert [method.callback.factor_at(e) for e in range(10)] == [1, 1, 2, 4, 8, 8, 8, 8, 8, 8]
    assert methods.ProgressiveBatch().growth(32) == 4  # the default


def test_a_trainer_job_that_cannot_regroup_refuses_it_and_fast_drops_it_with_the_reason():
    """The Trainer grows the batch (tests/test_trainer_progressive_batch.py), but not under
    gradient accumulation (a `batch_fixed` job)."""
    job = methods.Job(model(), LOSS, keras.optimizers.Adam(), data().element_spec, 2, 16, 4)
    with pytest.raises(ValueError, match="accumulate_steps=1"):
        methods.ProgressiveBatch().check(dataclasses.replace(job, batch_fixed=True))
    images = tf.data.Dataset.from_tensor_slices(
        (RNG.normal(size=(16, 8, 8, 1)).astype("float32"), RNG.integers(0, 3, 16))
    ).batch(4)
    net = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    trainer = tfaccel.Trainer(net, optimizer="adam", loss=LOSS, methods="fast", accumulate_steps=2)
    with pytest.warns(UserWarning, match="progressive batch dropped"):
        trainer.fit(images, epochs=1, verbose=0)
    dropped = dict(trainer.methods.plan.dropped)
    assert "accumulate_steps=1" in dropped["progressive batch"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(stages=1), "stages"),
        (dict(until=0.0), "until"),
        (dict(ramp_epochs=0), "ramp_epochs must be a number of epochs > 0"),
        (dict(ramp_epochs=math.inf), "ramp_epochs"),
        (dict(final=0), "final"),
        (dict(final="big"), "final"),
        (dict(rate_power=2), "rate_power"),
        (dict(growth=3), "growth"),
        (dict(growth=1), "growth"),
        (dict(growth=128), "growth"),
        (dict(growth=True), "growth"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        methods.ProgressiveBatch(**kwargs)


def test_a_final_batch_below_the_start_is_refused_before_step_one():
    optimizer = keras.optimizers.Adam()
    with pytest.raises(ValueError, match="below the job's batch"):
        methods.for_fit(
            [methods.ProgressiveBatch(final=2)],
            model(),
            data(),
            epochs=2,
            loss=LOSS,
            optimizer=optimizer,
        )
    assert not optimizer.built


def normalized(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4),
            keras.layers.BatchNormalization(momentum=0.9, name="norm"),
            keras.layers.Dense(3),
        ]
    )


def test_batch_norm_momentum_follows_the_growth_in_fit_and_comes_back_at_the_end(tmp_path):
    net = normalized()
    method = methods.ProgressiveBatch(final=16, stages=3, until=0.5)  # growth 4
    plain = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)  # unshuffled: X[:4] first
    plan = methods.for_fit([method], net, plain, epochs=3, loss=LOSS, optimizer="sgd")
    assert any("BatchNorm momentum 0.9 -> 0.656" in text for _, text in plan.table())
    net.compile(plan.optimizer, plan.loss)
    norm = net.get_layer("norm")
    seen = []

    class Moving(keras.callbacks.Callback):
        """Each epoch's first step by hand: the moving mean moves by 1 - 0.9 ** 4 towards
        the mean of the batch (the first 4, 8, 16 rows of X, the epoch's stage batch)."""

        def __init__(self):
            super().__init__()
            self.firsts = []

        def on_train_batch_begin(self, batch, logs=None):
            seen.append(norm.momentum)
            if batch == 0:
                dense = [w.numpy() for w in net.layers[0].weights]
                self.firsts.append([dense, norm.moving_mean.numpy().copy()])

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.firsts[-1].append(norm.moving_mean.numpy().copy())

    moving = Moving()
    path = str(tmp_path / "best.keras")  # saved at each epoch's end, after the method's
    saved = keras.callbacks.ModelCheckpoint(path)
    net.fit(plan.dataset, epochs=3, callbacks=[*plan.callbacks, moving, saved], verbose=0)
    assert set(seen) == {0.9**4}
    for rows, (dense, before, after) in zip((4, 8, 16), moving.firsts, strict=True):
        batch_mean = (X[:rows] @ dense[0] + dense[1]).mean(axis=0)
        expected = before * 0.9**4 + batch_mean * (1 - 0.9**4)
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-5)
    assert norm.momentum == 0.9 and norm.get_config()["momentum"] == 0.9
    assert keras.models.load_model(path).get_layer("norm").momentum == 0.9


def test_a_second_plan_before_the_first_fit_reads_the_users_momentum():
    """Planning sets m ** growth at once (for the Trainer's trace); a plan made again
    before any fit (the table inspected first) is not compounded."""
    net = normalized()
    for _ in range(2):
        method = methods.ProgressiveBatch(final=16, stages=3, until=0.5)
        plan = methods.for_fit([method], net, data(), epochs=3, loss=LOSS)
        assert net.get_layer("norm").momentum == 0.9**4
        assert any("BatchNorm momentum 0.9 -> 0.656 on 1 layer (^4)" in t for _, t in plan.table())
    net.compile(plan.optimizer, plan.loss)
    net.fit(plan.dataset, epochs=1, callbacks=plan.callbacks, verbose=0)
    assert net.get_layer("norm").momentum == 0.9


def test_a_model_without_batch_norm_or_with_keep_gets_no_momentum_change():
    method = methods.ProgressiveBatch(final=16)
    plan = methods.for_fit([method], model(), data(), epochs=3, loss=LOSS)
    assert method.statistics is None
    assert not any("BatchNorm" in text for _, text in plan.table())
    net, kept = normalized(), methods.ProgressiveBatch(final=16, batch_norm="keep")
    methods.for_fit([kept], net, data(), epochs=3, loss=LOSS)
    assert kept.statistics is None and net.get_layer("norm").momentum == 0.9
    with pytest.raises(ValueError, match="batch_norm must be 'follow' or 'keep'"):
        methods.ProgressiveBatch(batch_norm="freeze")


def test_batch_norm_copies_follow_by_name_and_other_layers_are_left_alone():
    """The Trainer may train a copy of the model: its layers of the same names follow
    from the user's momentum (never compounded epoch after epoch); others are untouched."""
    given = normalized()
    statistics = methods.batch_growth.BatchNormFollowsBatch(
        methods.batch_growth.batch_norm_layers(given), growth=4
    )
    statistics.follow()
    copy = keras.Sequential.from_config(given.get_config())  # built at 0.9 ** 4
    other = keras.layers.BatchNormalization(momentum=0.5, name="other")
    copy.add(other)
    statistics.set_model(copy)
    for epoch in range(3):
        statistics.on_epoch_begin(epoch)
        assert copy.get_layer("norm").momentum == given.get_layer("norm").momentum == 0.9**4
        statistics.on_epoch_end(epoch)
        assert copy.get_layer("norm").momentum == given.get_layer("norm").momentum == 0.9
    assert other.momentum == 0.5
