"""Judged by outcome (issue 67): a faster policy that changes the numerics is adopted only
when the paired loss check finds it does not cost the path; the probe is bounded by the
first epoch; the doctor does not predict a numerics fix as a time-to-accuracy gain."""

from __future__ import annotations

import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_doctor import measured
from test_precision_auto import build, fake_op_rates, fake_probe

from tfaccel.choices import outcome, policy, resolution, timing
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.doctor import fix_rules

F32, BF16 = "float32", "mixed_bfloat16"
EPOCH = 1000  # steps: room for the check (25 steps a setting, 5 % of the epoch)


def auto(monkeypatch, losses: dict, epoch_steps: int = EPOCH):
    """`resolve_fit`'s precision with bfloat16's step faked 2x float32's and the paired
    check's per-step losses planted (`losses`: policy -> losses of a step)."""
    monkeypatch.setattr(policy, "candidates", lambda *a: ([F32, BF16], "x"))
    fake_op_rates(monkeypatch, 2.0)
    monkeypatch.setattr(timing, "time_steps", fake_probe({F32: 100.0, BF16: 200.0}, []))
    asked_steps: list = []

    def paired(*args, steps, **kwargs):
        asked_steps.append(steps)
        return {p: list(losses[p][:steps]) for p in (F32, BF16)}

    monkeypatch.setattr(outcome, "paired_losses", paired)
    feed = types.SimpleNamespace(is_function=False, steps=-1, global_batch=32)
    step = resolution.Step(build(), None, tf.distribute.get_strategy())
    job = resolution.Job(feed, epoch_steps, 150)  # 150 declared epochs
    chosen = resolution.resolve_fit(step, resolution.Asked(precision=True), job, LoopSizer(4))
    return chosen.precision, asked_steps


def falling(start: float, steps: int = 100, wobble: float = 0.01) -> list[float]:
    """A falling training loss with batch-to-batch noise (the same batches for both)."""
    noise = np.random.default_rng(0).normal(0.0, wobble, steps)
    return [start * 0.99**i + n for i, n in enumerate(noise)]


def test_a_faster_policy_that_doubles_the_loss_is_not_adopted(monkeypatch):
    base = falling(0.5)
    doubled = [2 * v for v in base]
    chosen, steps = auto(monkeypatch, {F32: base, BF16: doubled})
    assert chosen.policy == F32 and steps == [25]  # 5 % of the first epoch, both settings
    # the last half of 25 steps: 13 losses, means by hand
    f32, bf16 = np.mean(base[12:25]), np.mean(doubled[12:25])
    assert chosen.reason.startswith(
        f"faster steps, not adopted: the loss after 800 examples was {bf16:.4g} vs {f32:.4g} "
        "(mixed_bfloat16 vs float32)"
    )
    assert "mixed_bfloat16: 2.00x float32" in chosen.reason  # what the probe had measured


def test_a_faster_policy_with_an_equal_loss_is_adopted(monkeypatch):
    base = falling(0.5)
    chosen, _ = auto(monkeypatch, {F32: base, BF16: list(base)})
    assert chosen.policy == BF16
    assert chosen.reason.startswith("2.00x float32")
    assert "the loss after 800 examples was" in chosen.reason
    assert "within 2% or the noise (the check: 25 steps a setting, " in chosen.reason


def test_a_gap_inside_the_batch_to_batch_noise_is_adopted():
    rng = np.random.default_rng(1)
    ref = list(1.0 + rng.normal(0, 0.2, 40))
    cand = [v + 0.05 + d for v, d in zip(ref, rng.normal(0, 0.3, 40), strict=True)]
    result = outcome.verdict(F32, BF16, {F32: ref, BF16: cand}, 1280)
    assert result.adopted and "95% interval [" in result.reason
    worse = [v * 1.5 for v in ref]  # 50 % higher on every batch: beyond any noise
    assert not outcome.verdict(F32, BF16, {F32: ref, BF16: worse}, 1280).adopted
    with pytest.raises(ValueError, match="equal lengths >= 2"):
        outcome.verdict(F32, BF16, {F32: ref, BF16: worse[:3]}, 1)


def test_a_first_epoch_too_short_for_the_check_keeps_the_policy_untimed(monkeypatch):
    """150 declared epochs of 300 steps: the check would need 320 steps an epoch."""
    timed: list = []
    monkeypatch.setattr(policy, "operations_choice", lambda *a: policy.PolicyChoice(F32, "ops"))
    monkeypatch.setattr(timing, "time_steps", lambda *a, **k: timed.append(1))
    monkeypatch.setattr(policy, "candidates", lambda *a: ([F32, BF16], "x"))
    feed = types.SimpleNamespace(is_function=False, steps=-1, global_batch=32)
    step = resolution.Step(build(), None, tf.distribute.get_strategy())
    job = resolution.Job(feed, 300, 150)
    chosen = resolution.resolve_fit(step, resolution.Asked(precision=True), job, LoopSizer(4))
    assert not timed and chosen.precision.policy == F32
    assert chosen.precision.reason == (
        "kept: not measured (a first epoch of 300 steps is too short for the paired loss check "
        "(8 steps a setting, both within 5% of it); from 320 steps an epoch up it is checked)"
    )
    assert outcome.check_steps(320) == 8 and outcome.check_steps(10**6) == outcome.MAX_STEPS


def test_a_check_that_cannot_run_does_not_adopt():
    def fails(steps):
        raise ValueError("the optimizer Odd cannot be copied from its config (no)")

    result = outcome.check(BF16, F32, fails, EPOCH, 32)
    assert not result.adopted
    assert result.reason == (
        "faster steps, not adopted: the paired loss check could not run (the optimizer Odd "
        "cannot be copied from its config (no))"
    )


def test_paired_losses_train_as_keras_fit_does():
    """The check's float32 losses are Keras' own per-batch training losses from the same
    weights, optimizer and batches (recovered from fit's running means)."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((64, 12), dtype=np.float32)
    y = (x.sum(axis=1) > 6).astype(np.int32)
    model = build()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    feed = types.SimpleNamespace(
        mapped=lambda fn: types.SimpleNamespace(
            distribute=lambda: fn(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
        )
    )
    strategy = tf.distribute.get_strategy()
    got = outcome.paired_losses(
        model,
        lambda y, p, w: per_example(y, p, w),
        strategy,
        feed,
        [F32],
        optimizer=keras.optimizers.SGD(0.5),
        steps=4,
    )[F32]
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    reference.compile(keras.optimizers.SGD(0.5), loss)
    means: list = []
    logged = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: means.append(logs["loss"])
    )
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[logged])
    keras_losses = [means[0]] + [(i + 1) * means[i] - i * means[i - 1] for i in range(1, 4)]
    np.testing.assert_allclose(got, keras_losses, rtol=1e-4)
    assert got[-1] < got[0]  # it trains


def test_the_doctor_does_not_predict_a_numerics_fix_as_time_to_accuracy():
    m = measured(precision_rates={F32: 100.0, BF16: 240.0}, step_s=0.2)
    fix = next(f for f in fix_rules.fixes(m) if f.numerics)
    assert "examples/s; time to accuracy unchecked)" in fix.line()
    assert "adopt it once a paired check finds the loss after the same examples" in fix.line()
    checked = type(fix)(**{**fix.__dict__, "outcome": "the loss after 800 examples was equal"})
    assert "time to accuracy unchecked" not in checked.line()
    assert checked.line().endswith(": the loss after 800 examples was equal)")
