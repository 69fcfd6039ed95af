"""Precision "auto" measures: candidates from the hardware, the choice from timings."""

from __future__ import annotations

import dataclasses
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import precision
from tfaccel.choices import copies, operations, outcome, policy, resolution, timing
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.devices import GPU

X = np.random.default_rng(0).random((256, 12), dtype=np.float32)
Y = (X.sum(axis=1) > 6).astype(np.int32)


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)


def build():
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)]
    )


def trainer(**kwargs):
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_loop=4,
        **kwargs,
    )


def weights(model):
    return [np.array(w) for w in model.get_weights()]


# -- the choice, with fake timings ----------------------------------------------------------


def test_a_candidate_3_percent_faster_keeps_float32():
    choice = precision.decide({"float32": 100.0, "mixed_bfloat16": 103.0}, "examples/s", "fake")
    assert choice.policy == "float32" and "1.03x" in choice.reason and "< 1.05x" in choice.reason
    assert "mixed_bfloat16 103 examples/s" in choice.describe()


def test_a_candidate_twice_as_fast_wins_and_says_by_how_much():
    choice = precision.decide({"float32": 100.0, "mixed_bfloat16": 200.0}, "examples/s", "3 steps")
    assert choice.policy == "mixed_bfloat16"
    assert choice.reason == "2.00x float32, measured on 3 steps"


def test_float32_fastest_stays_and_float32_is_required():
    assert precision.decide({"float32": 100.0, "mixed_float16": 60.0}, "", "x").policy == "float32"
    with pytest.raises(ValueError, match="float32 must be measured"):
        precision.decide({"mixed_bfloat16": 1.0}, "", "x")


def gpu(capability):
    return GPU(0, "fake", capability, 16000, physical=None)


@pytest.mark.parametrize(
    "gpus, flags, expected",
    [
        ([], [], ["float32"]),
        ([], ["avx2", "fma"], ["float32"]),
        ([], ["amx_bf16", "amx_tile"], ["float32", "mixed_bfloat16"]),
        ([], ["avx512_bf16", "avx512_fp16"], ["float32", "mixed_bfloat16", "mixed_float16"]),
        ([gpu((8, 0))], [], ["float32", "mixed_bfloat16", "mixed_float16"]),
        ([gpu((7, 5))], [], ["float32", "mixed_float16"]),
        ([gpu((6, 1))], [], ["float32"]),
    ],
)
def test_candidates_come_from_the_hardware(gpus, flags, expected):
    assert precision.candidates(gpus, flags)[0] == expected


def test_a_cpu_without_bf16_flags_probes_nothing(monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("probed")

    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(operations, "op_rates", no_probe)
    monkeypatch.setattr(timing, "time_steps", no_probe)
    choice = precision.choose()
    assert choice.policy == "float32" and "no bf16" in choice.reason and not choice.rates
    t = trainer(precision="auto")
    t.fit(data(), epochs=1, verbose=0)
    assert t.model.dtype_policy.name == "float32"
    assert "no bf16" in t.settings["dtype_policy"]


def test_the_operation_probe_measures_each_candidate_once_per_process(monkeypatch):
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    built = []
    real_ops = operations._ops

    def counting_ops(dtype):
        built.append(dtype.name)
        return real_ops(dtype)

    monkeypatch.setattr(operations, "_ops", counting_ops)
    operations.op_rates.cache_clear()  # the module's own cache, as a new process has it
    try:
        first, second = precision.choose(), precision.choose()
    finally:
        operations.op_rates.cache_clear()
    assert built == ["float32", "bfloat16"]  # measured once: the second choice is cached
    assert set(first.rates) == {"float32", "mixed_bfloat16"} and first.unit == "FLOP/s"
    assert first == second and "measured on a 1024x1024 matmul" in first.reason


# -- the Trainer's probe leaves no trace --------------------------------------------------------


def seed(value):
    keras.utils.set_random_seed(value)
    tf.random.set_global_generator(tf.random.Generator.from_seed(value))


def forced(policy):
    """`precision.decide` that returns `policy` whatever the (real) timings said."""
    real = precision.decide

    def decide(rates, unit, what):
        measured = real(rates, unit, what)
        return precision.Choice(policy, f"forced by the test ({measured.reason})", rates, unit)

    return decide


@pytest.mark.parametrize("winner", ["mixed_bfloat16", "float32"])
def test_a_fit_with_the_probe_equals_a_fit_with_the_chosen_policy_given_by_hand(
    monkeypatch, winner
):
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(policy, "decide", forced(winner))
    monkeypatch.setattr(timing, "too_short", lambda *args: None)  # 16 steps: timed
    # An 8-step epoch: the paired loss check gets 4 steps a setting, and (on this tiny
    # model) adopts whatever the probe forced; its real training leaves no trace either.
    monkeypatch.setattr(outcome, "SHARE", 1.0)
    monkeypatch.setattr(outcome, "MIN_STEPS", 2)
    monkeypatch.setattr(timing, "tied", lambda *a: None)  # the readings' verdict forced too
    real = outcome.verdict
    monkeypatch.setattr(outcome, "verdict", lambda *a: dataclasses.replace(real(*a), adopted=True))
    seed(3)
    auto = trainer(precision="auto")
    auto_history = auto.fit(data(), epochs=2, verbose=0).history
    after_auto = (np.random.random(), float(tf.random.get_global_generator().normal([])))
    after_auto += (keras.random.randint([], 0, 10**9, seed=None).numpy().item(),)
    assert set(auto.precision_choice.rates) == {"float32", "mixed_bfloat16"}
    assert auto.model.dtype_policy.name == winner, auto.precision_choice.reason
    assert winner in auto.settings["dtype_policy"] and "examples/s" in auto.settings["dtype_policy"]

    seed(3)
    by_hand = trainer(precision=winner)
    hand_history = by_hand.fit(data(), epochs=2, verbose=0).history
    after_hand = (np.random.random(), float(tf.random.get_global_generator().normal([])))
    after_hand += (keras.random.randint([], 0, 10**9, seed=None).numpy().item(),)
    assert auto_history == hand_history
    for a, b in zip(weights(auto.model), weights(by_hand.model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert after_auto == after_hand  # the random states are as if nothing was timed


def test_the_copy_under_a_policy_keeps_weights_and_a_float32_head():
    model = build()
    copy = copies.under(model, "mixed_bfloat16")
    assert [layer.dtype_policy.name for layer in copy.layers] == ["mixed_bfloat16", "float32"]
    assert all(w.dtype == "float32" for w in copy.weights)
    for a, b in zip(weights(model), weights(copy), strict=True):
        np.testing.assert_array_equal(a, b)
    reference = model(X[:64]).numpy()
    out = copy(X[:64])
    assert out.dtype == "float32"
    np.testing.assert_allclose(out.numpy(), reference, atol=0.05)  # bfloat16's 8-bit mantissa


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "bfloat16"])
def test_the_copy_s_weights_are_its_own_values_not_shared(mirrored, policy):
    with mirrored.scope():
        model = build()
        copy = copies.under(model, policy)
    assert copy.layers[0].kernel.dtype == keras.DTypePolicy(policy).variable_dtype  # head: f32
    for a, b in zip(weights(model), weights(copy), strict=True):
        np.testing.assert_allclose(b.astype("float32"), a, rtol=1e-2)  # bfloat16: rounded
    before = weights(model)
    for w in copy.weights:
        w.assign(w + 1.0)
    for a, b in zip(before, weights(model), strict=True):
        np.testing.assert_array_equal(a, b)  # the source's untouched


def test_a_copy_whose_weights_do_not_pair_up_says_so():
    wider = keras.Sequential([keras.Input((12,)), keras.layers.Dense(33), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="could not be copied"):
        copies.under(build(), "mixed_bfloat16", builder=lambda: wider)


def test_a_compiled_model_is_trained_as_a_copy_and_gets_its_weights_back():
    model = build()
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = weights(model)
    t = tfaccel.Trainer(model, precision="mixed_bfloat16", steps_per_loop=4)
    assert t.model is not model and t.model.layers[0].dtype_policy.name == "mixed_bfloat16"
    assert model.dtype_policy.name == "float32"  # the user's model keeps its policy
    t.fit(data(), epochs=1, verbose=0)
    after = weights(model)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    for a, b in zip(after, weights(t.model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bfloat16_and_float32_losses_stay_close_on_a_small_job():
    keras.utils.set_random_seed(5)
    f32 = trainer().fit(data(), epochs=3, verbose=0).history["loss"]
    keras.utils.set_random_seed(5)
    bf16 = trainer(precision="mixed_bfloat16").fit(data(), epochs=3, verbose=0).history["loss"]
    assert f32[-1] < f32[0] and bf16[-1] < bf16[0]
    np.testing.assert_allclose(bf16, f32, rtol=0.05)


def test_bad_policies_keep_their_clear_messages(monkeypatch):
    with pytest.raises(ValueError, match="expected 'auto' or one of"):
        trainer(precision="mixed_float8")
    monkeypatch.setattr(precision, "_warned_slow", False)
    with pytest.warns(UserWarning, match="much slower"):
        precision.resolve("mixed_float16", gpus=[])


def precision_auto(model, strategy=None, steps=None):
    """The policy `resolution.resolve_fit` picks for `model` on a job of `steps` steps (one
    epoch of them), the probe faked by the test."""
    feed = types.SimpleNamespace(is_function=False, steps=-1, global_batch=32)  # faked probe
    step = resolution.Step(model, None, strategy)
    job = resolution.Job(feed, steps, 1)
    asked = resolution.Asked(precision=True)
    return resolution.resolve_fit(step, asked, job, LoopSizer("auto")).precision


def fake_probe(rates: dict, calls: list):
    """A `timing.time_steps` that records its call and reads `rates` (policy -> examples/s)."""

    def time_steps(*args, **kwargs):
        calls.append(kwargs.get("epoch_steps"))
        readings = {(p, False): r for p, r in rates.items()}
        return {"rates": readings, "rounds": 3, "steps": 1, "seconds": 0.0}

    return time_steps


def fake_op_rates(monkeypatch, bf16_gain):
    rates = {"float32": 1e9, "mixed_bfloat16": bf16_gain * 1e9}
    choice = precision.decide(rates, "FLOP/s", "fake operations")
    monkeypatch.setattr(policy, "choose", lambda *args, **kwargs: choice)


@pytest.mark.parametrize(
    ("gain", "steps", "timed", "why"),
    [
        (1.02, 400, False, "from 510 steps up"),
        (1.02, 1000, True, ""),
        (1.1, 16, False, "too short for the paired loss check"),
    ],
)
def test_the_probe_runs_only_on_a_first_epoch_long_enough_to_pay_it_back(
    monkeypatch, gain, steps, timed, why
):
    """A 1.02x gain saves 2 % of a step: the 10 probe steps pay back from 510 steps an
    epoch up; below 320 steps an epoch the paired loss check has no room (8 steps a
    setting within 5 %): no other policy could be adopted, so none is timed."""
    fake_op_rates(monkeypatch, gain)
    monkeypatch.setattr(policy, "candidates", lambda: (["float32", "mixed_bfloat16"], "x"))
    calls: list = []
    equal = {"float32": 1.0, "mixed_bfloat16": 1.0}
    monkeypatch.setattr(timing, "time_steps", fake_probe(equal, calls))
    choice = precision_auto(build(), steps=steps)
    assert bool(calls) is timed
    if not timed:
        assert choice.policy == "float32" and "too short" in choice.reason
        assert why in choice.reason
    assert timing.too_short(["float32", "mixed_bfloat16"], None) is None


def test_a_short_fit_keeps_its_policy_without_timing_the_model(monkeypatch):
    fake_op_rates(monkeypatch, 1.1)
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    timed = []
    monkeypatch.setattr(timing, "time_steps", lambda *a, **k: timed.append(1))
    t = trainer(precision="auto")
    t.fit(data(), epochs=2, verbose=0)  # 16 steps
    assert not timed and t.model.dtype_policy.name == "float32"
    assert "too short" in t.settings["dtype_policy"]


def test_a_short_fit_keeps_its_policy_and_names_the_operations_pick_not_adopted(monkeypatch):
    fake_op_rates(monkeypatch, 2.5)
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    timed = []
    monkeypatch.setattr(timing, "time_steps", lambda *a, **k: timed.append(1))
    t = trainer(precision="auto")
    t.fit(data(), epochs=1, verbose=0)  # 8 steps: no room for the paired loss check
    assert not timed and t.model.dtype_policy.name == "float32"
    row = t.settings["dtype_policy"]
    assert "the operations' pick mixed_bfloat16 (2.50x float32's) changes the numerics" in row
    assert "not adopted untimed and without the paired loss check" in row


def test_the_workers_of_a_multi_worker_job_decide_from_the_same_operation_rates(monkeypatch):
    """One worker reads bfloat16's operations 1.2x float32's, the other 2.0x (noise, or one
    read the cache while the other measured): alone they would take different policies
    (a different model on each: its collectives no longer pair up). Agreed, both take the
    largest readings and decide alike, for a short job (the operations' pick) and a long
    one (both time the model)."""
    readings = [
        {"float32": 1.0e9, "mixed_bfloat16": 1.2e9},
        {"float32": 0.9e9, "mixed_bfloat16": 2.0e9},
    ]
    monkeypatch.setattr(policy, "candidates", lambda: (["float32", "mixed_bfloat16"], "x"))
    monkeypatch.setattr(policy, "is_multi_worker", lambda strategy: True)
    timed: list = []
    measured = {"float32": 1.0, "mixed_bfloat16": 3.0}
    monkeypatch.setattr(timing, "time_steps", fake_probe(measured, timed))
    equal = lambda *a, steps, **k: {"float32": [0.5] * steps, "mixed_bfloat16": [0.5] * steps}  # noqa: E731
    monkeypatch.setattr(outcome, "paired_losses", equal)
    alone, agreed = [], []
    for me, other in ((0, 1), (1, 0)):
        mine = precision.decide(readings[me], "FLOP/s", "this worker's operations")
        monkeypatch.setattr(policy, "choose", lambda *a, mine=mine, **k: mine)
        alone.append(policy.by_operations("float32", "short"))
        others = iter(readings[other][p] for p in sorted(readings[other]))
        monkeypatch.setattr(policy, "agree", lambda s, v, o=others: max(v, next(o)))
        ops = policy.operations_choice(strategy=object())
        assert ops.rates == {"float32": 1.0e9, "mixed_bfloat16": 2.0e9}
        for steps in (8, 10_000):
            others = iter(readings[other][p] for p in sorted(readings[other]))
            monkeypatch.setattr(policy, "agree", lambda s, v, o=others: max(v, next(o)))
            agreed.append(precision_auto(build(), object(), steps))
    assert [c.policy for c in alone] == ["float32"] * 2  # the pick is named, not adopted
    assert alone[0].reason == "kept: not measured (short)"  # 1.2x: below RULE_GAIN
    assert "pick mixed_bfloat16 (2.22x float32's)" in alone[1].reason  # each its own
    short, long = agreed[0::2], agreed[1::2]
    assert [c.policy for c in short] == ["float32"] * 2
    assert all("pick mixed_bfloat16 (2.00x float32's)" in c.reason for c in short)
    assert [c.policy for c in long] == ["mixed_bfloat16"] * 2 and len(timed) == 2
    monkeypatch.setattr(policy, "is_multi_worker", lambda strategy: False)
    assert policy.operations_choice(object()).rates == readings[1]  # one worker: its own
