"""The range test sized to the job (`job_examples`): a ramp of at most 5 % of its steps."""

import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import tuning
from tfaccel.tuning import joint
from tfaccel.tuning.lr import decline as lr_decline
from tfaccel.tuning.lr import sizing as lr_sizing

X = np.random.default_rng(1).normal(size=(512, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("int32")


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _dataset(batch=16):
    data = tf.data.Dataset.from_tensor_slices((X, Y)).repeat()
    return data.batch(batch, drop_remainder=True)


def test_a_job_too_small_to_pay_runs_nothing(tmp_path, monkeypatch):
    model = _model()
    weights = [w.copy() for w in model.get_weights()]

    def no_fit(*args, **kwargs):
        raise AssertionError("the range test trained a step")

    monkeypatch.setattr(model, "fit", no_fit)
    # 10 epochs of 512 examples at batch 16: 320 steps, of which 5 % is 16 < 30
    report = tuning.find_learning_rate(model, _dataset(), job_examples=10 * 512)
    assert report.suggestion is None and report.reason.startswith("too small to pay")
    assert "needs 30 steps" in report.reason and "5% of this job is 16" in report.reason
    assert report.stopped == "not run" and report.steps == 0 and report.rates == []
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not model.optimizer.built  # not even its slots
    out = report.to_dict()
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert "too small to pay" in str(report) and report.batch_size == 16
    assert str(report).startswith("learning rate: none at batch 16; too small to pay")
    report.plot(tmp_path / "lr.png")
    assert (tmp_path / "lr.png").stat().st_size > 0


def test_a_job_of_known_size_gets_a_ramp_of_its_share(monkeypatch):
    # The steps alone: on this tiny model the job's seconds are too few for the test to
    # pay, and it would decline at its first reading (tests/test_decline.py).
    monkeypatch.setattr(lr_decline, "PROBE_SHARE", 1e9)
    # 1000 steps at batch 16: a ramp of 50 (under num_steps=100)
    report = tuning.find_learning_rate(
        _model(), _dataset(), job_examples=16_000, max_lr=1e-2, num_steps=100
    )
    assert report.ramp_steps == 50 and report.steps == 50 and len(report.losses) == 50
    assert report.stopped == "end of ramp"
    assert report.batch_size == 16 and " at batch 16" in str(report)  # the batch it is for
    # arrays: the batch is batch_size; a large job is capped by num_steps
    report = tuning.find_learning_rate(
        _model(), X, Y, batch_size=8, job_examples=10**6, max_lr=1e-2, num_steps=40
    )
    assert report.ramp_steps == 40 == report.steps and report.batch_size == 8


def test_sizing_needs_the_batch():
    unknown = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)  # last batch may be short
    assert lr_sizing.assumed_batch(unknown, None, None) is None  # a report then names none
    assert lr_sizing.assumed_batch(X, Y, None) == 32  # arrays: Keras' default batch
    with pytest.raises(ValueError, match="pass batch_size"):
        tuning.find_learning_rate(_model(), unknown, job_examples=10**6)
    with pytest.raises(ValueError, match="positive integer"):
        tuning.find_learning_rate(_model(), _dataset(), job_examples=0)
    assert lr_sizing.ramp_steps(10**6, 16, 100) == (100, 30, 62_500)
    assert lr_sizing.ramp_steps(16_000, 16, 20) == (20, 20, 1000)  # num_steps < MIN_RAMP


@pytest.mark.parametrize(("given", "want"), [({"job_examples": 9000}, 9000), ({"epochs": 3}, 1536)])
def test_tune_passes_the_jobs_size_to_the_range_test(monkeypatch, given, want):
    seen = {}

    def finder(model, data, **kwargs):
        seen.update(kwargs)
        return lr_sizing.not_run(1, 30, 20, kwargs["job_examples"], 16)

    choice = types.SimpleNamespace(batch_size=16, learning_rate=1e-3, reason="given", methods=())
    monkeypatch.setattr(joint, "_batch_step", lambda *args: (choice, None))
    monkeypatch.setattr(joint, "find_learning_rate", finder)
    tuned = joint.tune(
        _model, (X, Y), loss="sparse_categorical_crossentropy", batch_size=16,
        learning_rate=1e-3, verbose=0, **given,
    )  # fmt: skip
    assert seen["job_examples"] == want
    assert tuned.learning_rate == 1e-3 and "too small to pay" in tuned.note
