"""The gradient noise scale against its exact value on a linear model."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import tuning

N, D = 20_000, 4


def linear_problem(noise):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + noise * rng.normal(size=N)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    w = np.array([[0.5], [-1.0], [0.0], [2.0]], dtype="float32")  # not at the optimum
    model.set_weights([w])
    # Per-example gradient of (x·w - y)²: 2 x (x·w - y). B_simple = tr(Σ) / |G|², exactly.
    per_example = 2 * x * (x @ w - y[:, None])
    mean = per_example.mean(axis=0)
    trace = float(((per_example - mean) ** 2).sum(axis=1).mean())
    exact = trace / float(mean @ mean)
    data = tf.data.Dataset.from_tensor_slices((x, y[:, None]))
    return model, data, exact


@pytest.mark.parametrize("noise", [0.5, 3.0])
def test_noise_scale_matches_the_exact_value_of_a_linear_model(noise):
    model, data, exact = linear_problem(noise)
    before = model.get_weights()[0].copy()
    estimate = tuning.gradient_noise_scale(model, data, "mse", small=8, big=512, batches=200)
    assert estimate.b_simple == pytest.approx(exact, rel=0.2)
    np.testing.assert_array_equal(model.get_weights()[0], before)  # weights untouched
    assert "B_simple" in str(estimate)


def test_noisier_labels_give_a_larger_noise_scale():
    low = tuning.gradient_noise_scale(*linear_problem(0.5)[:2], "mse", batches=100)
    high = tuning.gradient_noise_scale(*linear_problem(3.0)[:2], "mse", batches=100)
    assert high.b_simple > low.b_simple


def test_bad_sizes_and_too_little_data():
    model, data, _ = linear_problem(1.0)
    with pytest.raises(ValueError, match="small < big"):
        tuning.gradient_noise_scale(model, data, "mse", small=64, big=64)
    with pytest.raises(ValueError, match="fewer than big=512"):
        tuning.gradient_noise_scale(model, data.take(100), "mse", small=8, big=512)
    assert math.isfinite(tuning.gradient_noise_scale(model, data, "mse", batches=4).b_simple)


def test_find_batch_size_keeps_the_best_batch_at_or_below_the_noise_scale():
    model, data, exact = linear_problem(0.5)  # B_simple ≈ 5.5 at these weights

    def build():
        fresh = keras.models.clone_model(model)
        fresh.set_weights(model.get_weights())
        return fresh

    report = tuning.find_batch_size(
        build,
        data,
        loss="mse",
        optimizer=lambda: keras.optimizers.SGD(0.0),  # the probes keep the weights...
        start=8,
        limit=512,
        mode="power",
        steps=2,
        noise_warmup=0,  # ...where the exact value is known
    )
    assert report.noise_scale == pytest.approx(exact, rel=0.5)
    assert report.decided_by == "noise scale" and report.best_batch_size == 8
    assert "B_simple" in report.table() and "best (noise scale)" in report.table()
    without = tuning.find_batch_size(
        build, data, loss="mse", start=8, limit=512, steps=2, noise_scale=False
    )
    assert without.noise_scale is None and without.decided_by == "throughput knee"


def test_the_draws_stop_once_the_estimate_is_precise_enough():
    model, data, exact = linear_problem(3.0)
    estimate = tuning.gradient_noise_scale(
        model, data, "mse", small=8, big=512, batches=50, tolerance=0.1
    )
    assert estimate.b_simple == pytest.approx(exact, rel=0.2)
    assert 4 <= estimate.batches < 50 and estimate.small_batches == 8 * estimate.batches
    with pytest.raises(ValueError, match="tolerance must be a relative error > 0"):
        tuning.gradient_noise_scale(model, data, "mse", tolerance=0)
    with pytest.raises(ValueError, match="min_batches must be >= 2"):
        tuning.gradient_noise_scale(model, data, "mse", tolerance=0.1, min_batches=1)
