"""A noise scale too noisy to tell is reported, not applied: the throughput knee decides."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import tuning
from tfaccel.tuning.batch import noise, noise_probe
from tfaccel.tuning.batch.report import BatchSizeReport

RATES = {8: 100.0, 16: 200.0, 32: 400.0, 64: 800.0, 128: 1600.0}  # no knee below 128


class StepClock:
    """A fake clock: each probe's `steps` + 1 reads advance by its batch over its rate."""

    def __init__(self, steps: int):
        self.ticks = [b / r for b, r in RATES.items() for _ in range(steps + 1)]
        self.now, self.calls = 0.0, 0

    def __call__(self):
        self.now += self.ticks[self.calls]
        self.calls += 1
        return self.now


def linear(weights, noise_level: float = 1.0, n: int = 8_192):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + noise_level * rng.normal(size=n)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([np.asarray(weights, "float32").reshape(4, 1)])
    return model, tf.data.Dataset.from_tensor_slices((x, y[:, None]))


def test_the_estimate_carries_its_relative_error():
    far, data = linear([0.5, -1.0, 0.0, 2.0])  # far from the optimum: |G|² is clear
    clear = tuning.gradient_noise_scale(far, data, "mse", small=8, big=64, batches=16)
    assert clear.relative_error <= noise.MAX_ERROR and clear.reliable
    assert "±" in str(clear)
    # At the optimum the mean gradient is lost in the noise of batches of 8 and 64.
    at_optimum, data = linear([1.0, -2.0, 0.5, 3.0], noise_level=3.0)
    lost = tuning.gradient_noise_scale(at_optimum, data, "mse", small=8, big=64, batches=16)
    assert not lost.reliable and lost.relative_error > noise.MAX_ERROR
    assert noise.error_text(math.inf) == "unbounded" and noise.error_text(0.25) == "25%"


def search(monkeypatch, relative_error: float, b_simple: float = 5.0) -> BatchSizeReport:
    """A search whose noise scale reads `b_simple` ± `relative_error`, and a knee at 128."""

    def estimate(*args, **kwargs):
        return noise.NoiseScale(b_simple, 1.0, b_simple, 8, 64, 128, 16, relative_error)

    monkeypatch.setattr(noise_probe, "gradient_noise_scale", estimate)
    model, data = linear([0.5, -1.0, 0.0, 2.0])
    return tuning.find_batch_size(
        lambda: keras.models.clone_model(model), data, loss="mse", start=8, limit=128,
        mode="power", steps=2, noise_warmup=0, clock=StepClock(steps=2), confirm=False,
    )  # fmt: skip


def test_a_noisy_estimate_bounds_nothing_and_the_report_says_why(monkeypatch):
    report = search(monkeypatch, relative_error=2.3)
    assert report.limits["throughput knee"] == 128 and report.limits["noise scale"] == 5.0
    assert report.best_batch_size == 128 and report.decided_by == "throughput knee"
    assert "time to accuracy" not in report.limits
    assert report.noise_scale_error == 2.3
    assert "B_simple ≈ 5 ± 230% (too noisy: not applied)" in report.limits_line()
    assert "too noisy to bound the batch, not applied" in report.noise_scale_note
    choice = tuning.recommend(report, batch_size=8, learning_rate=1e-3, optimizer="adam")
    assert choice.batch_size == 128 and "too noisy: not applied" in choice.reason


def test_a_precise_estimate_bounds_at_the_largest_b_simple_it_supports(monkeypatch):
    # 5 ± 10 %: two standard errors allow up to 5 / (1 - 2 × 0.1) = 6.25.
    assert noise.upper_limit(5.0, 0.1) == pytest.approx(6.25)
    assert noise.upper_limit(5.0, 0.5) == math.inf and noise.upper_limit(5.0, None) == math.inf
    report = search(monkeypatch, relative_error=0.1)
    assert report.best_batch_size == 8 and report.decided_by == "noise scale"
    assert "B_simple ≈ 5 ± 10% (allows ≤ 6)" in report.limits_line()
    assert "not applied" not in str(report)
    # 20 ± 20 % allows up to 33: batch 32 is within it, 64 is not.
    assert search(monkeypatch, relative_error=0.2, b_simple=20.0).best_batch_size == 32


def test_the_error_survives_json(monkeypatch):
    report = search(monkeypatch, relative_error=math.inf)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["noise_scale_error"] == "inf"
    back = BatchSizeReport.from_dict(data)
    assert back.noise_scale_error == math.inf and back.limits_line() == report.limits_line()
    assert "± unbounded (too noisy: not applied)" in back.limits_line()


@pytest.mark.parametrize("error, reliable", [(None, False), (0.49, True), (0.5, False)])
def test_a_step_is_reliable_only_when_measured_precisely(error, reliable):
    step = noise_probe.NoiseStep(40.0, 0, 0.0, "", error)
    assert step.reliable is reliable and math.isfinite(step.bound) is reliable
    assert not noise_probe.NoiseStep(None, 0, 0.0, "", 0.1).reliable
