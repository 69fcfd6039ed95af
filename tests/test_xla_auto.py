"""jit_compile="auto" measures XLA on the model's own step, with fake timings choosing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.choices import policy, timing
from tfaccel.choices import xla as xla_choice
from tfaccel.choices.passes import GradientLoops

X = np.random.default_rng(0).random((256, 12), dtype=np.float32)
Y = (X.sum(axis=1) > 6).astype(np.int32)
EPOCHS, STEPS = 2, 100  # 100 steps an epoch: the least an XLA-only probe fits in (10 %)


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(32).repeat()


def build():
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)]
    )


@keras.saving.register_keras_serializable(package="tfaccel_tests")
class PyDouble(keras.layers.Layer):
    """Doubles its input through `tf.py_function`: XLA cannot compile it."""

    def call(self, x):
        out = tf.py_function(lambda a: a * 2.0, [x], x.dtype)
        out.set_shape(x.shape)
        return out


def build_uncompilable():
    return keras.Sequential(
        [keras.Input((12,)), PyDouble(), keras.layers.Dense(16, activation="relu"),
         keras.layers.Dense(2)]
    )  # fmt: skip


def trainer(builder=build, **kwargs):
    return tfaccel.Trainer(
        builder,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_loop=50,
        **kwargs,
    )


def fake_timer(monkeypatch, plain_s: float, xla_s: float):
    """The passes run for real (XLA compiles, or fails to), but read `plain_s` / `xla_s`
    seconds a step: a fake clock, so the choice does not depend on this machine."""
    real = GradientLoops.seconds

    def seconds(self, reduce, iterator, steps, calls):
        real(self, reduce, iterator, steps, calls)
        step = xla_s if self._replica_fn is not None else plain_s
        return [step * steps] * calls

    monkeypatch.setattr(GradientLoops, "seconds", seconds)


def seed(value):
    keras.utils.set_random_seed(value)
    tf.random.set_global_generator(tf.random.Generator.from_seed(value))


def fit(t):
    history = t.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0).history
    state = (np.random.random(), float(tf.random.get_global_generator().normal([])))
    return history, [np.array(w) for w in t.model.get_weights()], state


@pytest.mark.parametrize("xla_s, expected", [(5.0, True), (9.9, False)], ids=["xla", "plain"])
def test_auto_trains_as_the_forced_choice_would(monkeypatch, xla_s, expected):
    fake_timer(monkeypatch, plain_s=10.0, xla_s=xla_s)
    seed(4)
    auto = trainer()
    auto_history, auto_weights, auto_state = fit(auto)
    assert auto.jit_compile is expected and auto.runner.jit_compile is expected
    row = auto.settings["jit_compile"]
    assert row.startswith(str(expected)) and "plain 3.2 examples/s" in row
    if expected:
        assert "XLA 2.00x the plain step (>= 1.05x), loss equal" in row
        assert "XLA 6.4 examples/s" in row
    else:
        assert "XLA only 1.01x the plain step (< 1.05x)" in row
    seed(4)
    forced = trainer(jit_compile=expected)
    forced_history, forced_weights, forced_state = fit(forced)
    assert auto_history == forced_history
    for a, b in zip(auto_weights, forced_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert auto_state == forced_state  # the random states are as if nothing was timed


def test_a_model_xla_cannot_compile_stays_unjitted_with_the_reason(monkeypatch):
    fake_timer(monkeypatch, plain_s=10.0, xla_s=1.0)  # XLA would win, if it compiled
    t = trainer(build_uncompilable)
    history = t.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0).history
    assert t.jit_compile is False and len(history["loss"]) == EPOCHS
    assert t.jit_choice.reason.startswith(
        "XLA cannot compile the model's step (unsupported op(s): EagerPyFunc)"
    )
    assert "EagerPyFunc" in t.settings["jit_compile"]


def test_a_short_job_is_not_measured_and_says_from_what_size_it_would_be(monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("timed")

    monkeypatch.setattr(timing, "time_steps", no_probe)
    t = trainer()
    t.fit(data(), epochs=1, steps_per_epoch=40, verbose=0)
    assert t.jit_compile is False
    assert t.jit_choice.reason == (
        "not measured: a first epoch of 40 steps is too short: the probe takes at least 10 "
        "steps and XLA's compilation, more than 10% of it; from 100 steps an epoch up it is "
        "measured"
    )
    assert t.settings["jit_compile"].startswith("False (not measured: a first epoch of 40")


def test_a_long_declared_job_with_a_short_first_epoch_is_not_probed(monkeypatch):
    """150 declared epochs (EarlyStopping may end it after a few): the probe is bounded by
    the first epoch's 40 steps, not the 6,000 declared."""

    def no_probe(*args, **kwargs):
        raise AssertionError("timed")

    monkeypatch.setattr(timing, "time_steps", no_probe)
    t = trainer()
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    t.fit(data(), epochs=150, steps_per_epoch=40, callbacks=[stop], verbose=0)
    assert t.jit_compile is False and "a first epoch of 40 steps" in t.jit_choice.reason


def test_the_first_readings_decline_a_probe_that_would_not_pay():
    first = {("float32", False): (0.5, 0.001)}  # traced in 0.5 s, 1 ms a step
    why = timing.admit(first, epoch_steps=100, spent_s=0.6)
    # 0.6 s spent + 0.499 s tracing + 2 warm-up steps + 6 ms of rounds = 1.107 s > 10 % of
    # the first epoch's 0.1 s, whatever the declared epochs
    assert why == (
        "declined: the first readings project a probe of 1.1 s, more than 10% of the first "
        "epoch (100 steps of 1 ms); from 22,020 steps an epoch up it is measured"
    )  # the rounds take 5 % of a longer epoch: 1.101 s fixed <= 5 % of 22,020 ms
    assert timing.admit(first, epoch_steps=22_020, spent_s=0.6) is None
    assert timing.admit(first, epoch_steps=21_000, spent_s=0.6) is not None


def readings(rates, losses, dropped=None):
    return {
        "rates": rates,
        "losses": losses,
        "dropped": dropped or {},
        "steps": 4,
        "rounds": 3,
        "seconds": 1.5,
    }


def test_precision_and_xla_are_decided_together(monkeypatch):
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    f32, bf16 = "float32", "mixed_bfloat16"
    rates = {(f32, False): 100.0, (f32, True): 104.0, (bf16, False): 101.0, (bf16, True): 130.0}
    losses = {(f32, False): 0.7, (f32, True): 0.7, (bf16, False): 0.701, (bf16, True): 0.703}
    chosen, xla = xla_choice.decide(readings(rates, losses), [f32, bf16], True)
    # float32's XLA (1.04x) does not pay; bfloat16's does (1.29x), and beats float32 by 1.3x
    assert chosen.policy == bf16 and chosen.rates == {f32: 100.0, bf16: 130.0}
    assert xla.jit_compile is True and xla.rates == {"plain": 101.0, "XLA": 130.0}
    assert xla.reason.startswith("XLA 1.29x the plain step (>= 1.05x), loss equal")


def test_xla_with_another_loss_is_not_chosen():
    rates = {("float32", False): 100.0, ("float32", True): 300.0}
    losses = {("float32", False): 0.5, ("float32", True): 0.51}
    _, xla = xla_choice.decide(readings(rates, losses), ["float32"], False)
    assert xla.jit_compile is False
    assert xla.reason.startswith(
        "XLA's loss 0.51 differs from the plain step's 0.5 by 0.01 > 0.001 (0.001 x max(1, |loss|))"
    )
    assert xla_choice.tolerance("mixed_bfloat16") == 0.02


def test_bad_jit_compile_values_keep_their_messages():
    with pytest.raises(ValueError, match="jit_compile must be True, False or 'auto', got 'yes'"):
        trainer(jit_compile="yes")


def test_two_logical_cpus_keep_the_plain_step_with_xlas_reason(monkeypatch, mirrored):
    # XLA cannot reach a variable on the other logical CPU: "auto" keeps the plain step
    # (where jit_compile=True fails) and says why.
    fake_timer(monkeypatch, plain_s=10.0, xla_s=5.0)
    seed(6)
    auto = trainer(strategy=mirrored)
    auto_history, auto_weights, _ = fit(auto)
    assert auto.jit_compile is False
    assert auto.jit_choice.reason.startswith(
        "XLA cannot compile the model's step (Trying to access resource "
    )
    assert "located in device" in auto.jit_choice.reason
    seed(6)
    forced_history, forced_weights, _ = fit(trainer(strategy=mirrored, jit_compile=False))
    assert auto_history == forced_history
    for a, b in zip(auto_weights, forced_weights, strict=True):
        np.testing.assert_array_equal(a, b)


class NoXla(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # as PipelineModel says it

    def call(self, x):
        return x


def test_what_is_not_measured_says_why_before_anything_runs():
    plain = build()
    assert xla_choice.not_compilable(plain) is None
    assert timing.too_short_for_xla(100, 1) is None
    assert timing.too_short_for_xla(199, 2).startswith(
        "a first epoch of 199 steps is too short: the probe takes at least 20 steps"
    )
    assert timing.too_short_for_xla(None, 1) == (
        "the job's length is unknown (pass steps_per_epoch)"
    )
    odd = keras.Sequential([keras.Input((12,)), NoXla(name="no_xla"), keras.layers.Dense(2)])
    assert xla_choice.not_compilable(odd) == (
        "layer(s) ['no_xla'] do not support XLA (supports_jit=False)"
    )
    tf_config = xla_choice.tf_config
    tf_config.enable_op_determinism()
    try:
        why = xla_choice.not_compilable(plain)
    finally:
        tf_config.disable_op_determinism()
    assert why == "op determinism is enabled, and XLA's kernels are not all deterministic"


def test_the_doctors_deep_mode_measures_xla_the_same_way():
    t = trainer(build_uncompilable)
    data_ = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    report = tfaccel.doctor.diagnose(t, data_, budget_s=2, rounds=1, deep=True)
    assert report.measured.xla_speedup is None
    assert (
        "XLA (deep=True): the model's passes do not compile with XLA: XLA cannot compile the "
        "model's step (unsupported op(s): EagerPyFunc)"
    ) in str(report)
