"""The doctor's MFU: FLOPs per example × the real step's examples/s ÷ the policy's peak."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.callbacks import _mfu
from tfaccel.doctor import mfu
from tfaccel.doctor import verdict as rules

FORWARD = 2 * 8 * 16 + 2 * 16 * 4  # a Dense 8 → 16 → 4 without bias: 2·in·out an example


def dense() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, use_bias=False),
            keras.layers.Dense(4, use_bias=False),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measured(**changes) -> rules.Measured:
    base = dict(
        batch=64, replicas=1, workers=1, device="CPU", trainer=False, steps_per_loop=1,
        steps_per_loop_setting=1, accumulate_steps=1, step_s=0.01, call_overhead_s=0.001,
        input_s=0.001, plain_input_s=None, real_s=0.02, real_wait_s=None, all_reduce_s=None,
        gradient_mb=0.001, cores=2, pipeline=[], memory={}, matmul_peak=1e10,
    )  # fmt: skip
    base.update(changes)
    return rules.Measured(**base)


SPEC = tf.TensorSpec((None, 8), tf.float32)


def test_the_flops_are_counted_and_divided_by_the_doctors_peak():
    found = mfu.measure(dense(), SPEC, measured())
    rate = 64 / 0.02  # examples/s of the real step
    assert found.flops_per_example == 3 * FORWARD
    assert found.examples_per_second == pytest.approx(rate)
    assert found.mfu == pytest.approx(3 * FORWARD * rate / 1e10)
    assert (found.peak_flops, found.devices, found.dtype) == (1e10, 1, "float32")
    assert found.line().startswith("MFU: 0.037% — 1.15 kFLOP an example × 3,200 examples/s")
    assert "float32 matmul peak (10 GFLOP/s; policy float32)" in found.line()


def test_gpus_in_sync_add_their_peaks_and_given_flops_are_kept():
    found = mfu.measure(dense(), SPEC, measured(device="GPU", replicas=2, flops_per_example=1e6))
    assert found.mfu == pytest.approx(1e6 * 3200 / (2 * 1e10)) and found.devices == 2
    assert "× 2 devices" in found.line()


def test_another_policys_peak_is_not_used(monkeypatch):
    # The doctor's float32 peak does not serve a bfloat16 model: its own dtype is timed.
    monkeypatch.setattr(_mfu, "measured_peak", lambda model: (4e10, "bfloat16"))
    m = measured(dtype_policy="mixed_bfloat16", flops_per_example=1e6)
    found = mfu.measure(dense(), SPEC, m)
    assert found.peak_flops == 4e10 and found.dtype == "bfloat16"
    assert found.mfu == pytest.approx(1e6 * 3200 / 4e10)


def test_no_flops_or_peak_no_mfu():
    assert mfu.utilisation(None, 100.0, 1e10) is None
    assert mfu.utilisation(1e6, 100.0, None) is None
    assert mfu.utilisation(1e6, 0.0, 1e10) is None


def test_diagnose_reports_the_mfu_of_the_measured_run():
    model = dense()
    x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype("int32"))).batch(32)
    report = tfaccel.doctor.diagnose(model, data, budget_s=3, rounds=1)
    found = report.mfu
    assert found.flops_per_example == 3 * FORWARD and 0 < found.mfu < 1
    assert found.examples_per_second == pytest.approx(report.rates()["real"])
    assert found.line() in str(report)
    assert json.loads(json.dumps(report.to_dict()))["mfu"]["mfu"] == pytest.approx(found.mfu)
