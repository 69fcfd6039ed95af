"""The inner loop alone: `Runner` driven directly, without `FitLoop`, callbacks or `fit`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.train.step.losses import PerExampleLoss, resolve_metrics
from tfaccel.train.step.runner import Runner
from tfaccel.train.step.runner_interface import Position

RNG = np.random.default_rng(0)
X = RNG.random((64, 4)).astype("float32")
Y = (X.sum(axis=1) > 2).astype("int32")
SCE = "sparse_categorical_crossentropy"


def make_runner(strategy=None, learning_rate=0.1, **kwargs):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        loss = PerExampleLoss(SCE)
        runner = Runner(
            model,
            optimizer=keras.optimizers.SGD(learning_rate),
            loss=loss,
            metrics=resolve_metrics(["accuracy"], loss),
            strategy=strategy,
            **kwargs,
        )
    return runner


def batches(n=8):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(n)


def distributed(runner, data):
    return iter(runner.strategy.experimental_distribute_dataset(data))


def test_train_runs_n_steps_and_reports_them():
    runner = make_runner()
    runner.build(batches())
    iterator = distributed(runner, batches())
    result = runner.train(iterator, 3)
    assert (result.steps, result.examples) == (3, 24.0)
    assert set(result.logs) == {"loss", "accuracy"} and result.seconds > 0
    assert np.isfinite(result.loop_loss) and result.nonfinite is None
    assert runner.position == Position(3, 0, 0)  # the loops advance the global step only
    assert runner.train(iterator, 10).steps == 5  # the data ends after 8 batches
    assert runner.train(iterator, 10).steps == 0


def test_how_the_steps_are_grouped_into_calls_does_not_change_the_weights():
    grouped = {}
    for calls in ([8], [1] * 8, [3, 5], [2, 2, 4]):
        runner = make_runner()
        runner.build(batches())
        iterator = distributed(runner, batches())
        results = [runner.train(iterator, n) for n in calls]
        grouped[tuple(calls)] = (runner.model.get_weights(), results[-1].logs)
    reference, reference_logs = grouped[(8,)]
    for weights, logs in grouped.values():
        for got, want in zip(weights, reference, strict=True):
            np.testing.assert_array_equal(got, want)
        assert logs == reference_logs


def test_two_replicas_train_as_one(mirrored):
    one, two = make_runner(), make_runner(mirrored)
    for runner in (one, two):
        runner.build(batches())
        assert runner.train(distributed(runner, batches()), 8).steps == 8
    for got, want in zip(two.model.get_weights(), one.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_evaluate_resets_the_metrics_and_reads_until_the_data_ends():
    runner = make_runner(evaluation_steps_per_loop=3)
    runner.build(batches())
    runner.train(distributed(runner, batches()), 8)
    logs = runner.evaluate(distributed(runner, batches()), None)
    model = runner.model
    model.compile(loss=SCE, metrics=["accuracy"])
    expected = model.evaluate(X, Y, batch_size=8, verbose=0, return_dict=True)
    assert logs["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert logs["accuracy"] == pytest.approx(expected["accuracy"])
    assert runner.evaluate(distributed(runner, batches()), 2)["loss"] != logs["loss"]


def test_a_non_finite_weight_is_named_after_the_loop():
    runner = make_runner(learning_rate=np.inf)
    runner.build(batches())
    result = runner.train(distributed(runner, batches()), 2)
    assert result.nonfinite is not None and "dense" in result.nonfinite


def test_position_and_checkpoint_items_round_trip(tmp_path):
    runner = make_runner()
    runner.build(batches())
    runner.train(distributed(runner, batches()), 4)
    runner.set_position(epoch=2, epoch_step=4)
    path = tf.train.Checkpoint(**runner.checkpoint_items()).write(str(tmp_path / "c"))
    other = make_runner()
    other.build(batches())
    with other.restoring():
        tf.train.Checkpoint(**other.checkpoint_items()).read(path).assert_consumed()
    assert other.position == Position(4, 2, 4)
    assert other.epoch_logs() == runner.epoch_logs()  # the running metrics came along
    for got, want in zip(other.model.get_weights(), runner.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert other.run_shape()["optimizer"] == "SGD"
