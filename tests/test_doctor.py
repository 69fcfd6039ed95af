"""tfaccel.doctor: the verdict rules, the report, state left untouched, bad inputs."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.doctor import fix_rules
from tfaccel.doctor import verdict as rules


def measured(**changes) -> rules.Measured:
    base = dict(
        batch=64,
        replicas=1,
        workers=1,
        device="CPU",
        trainer=True,
        steps_per_loop=100,
        steps_per_loop_setting="auto",
        accumulate_steps=1,
        step_s=0.010,
        call_overhead_s=0.001,
        input_s=0.001,
        plain_input_s=None,
        real_s=0.010,
        real_wait_s=0.0,
        all_reduce_s=None,
        gradient_mb=1.0,
        cores=2,
        pipeline=[("TensorSlice", None), ("Batch", None), ("Prefetch", None)],
        memory={"peak_mb": 100.0, "capacity_mb": 1000.0, "what": "RAM", "fixed_mb": 10.0},
        flops_per_example=1e6,
        matmul_peak=1e10,
    )
    base.update(changes)
    m = rules.Measured(**base)
    if "real_s" not in changes:  # consistent with the parts: what the model predicts
        m.real_s = rules.modelled_step_s(m)
    return m


def test_verdicts_follow_the_real_step():
    assert rules.verdict(measured()) == "compute"
    waits = dict(input_s=0.05, real_s=0.05, real_wait_s=0.04)
    slow_input = measured(pipeline=[("TensorSlice", None), ("Map", 1)], **waits)
    assert rules.verdict(slow_input) == "input" and rules.disagreement(slow_input) is None
    assert rules.verdict(measured(step_s=0.0001, call_overhead_s=0.002, steps_per_loop=1)) == (
        "host"
    )
    comm = measured(replicas=2, all_reduce_s=0.008)
    assert rules.verdict(comm) == "communication"
    full = measured(memory={"peak_mb": 950.0, "capacity_mb": 1000.0, "what": "GPU"})
    assert rules.verdict(full) == "memory"
    # Without a timed wait, the input alone decides.
    assert rules.verdict(measured(input_s=0.05, real_wait_s=None)) == "input"


def test_when_the_parts_disagree_the_real_step_is_trusted():
    # The input alone read fast (a buffer, a warm iterator), the real step waited 80 %.
    fast_alone = measured(input_s=0.0001, real_s=0.05, real_wait_s=0.04)
    assert rules.verdict(fast_alone) == "input"
    assert "disagree" in rules.disagreement(fast_alone)
    step = rules.cached_step_s(fast_alone)
    assert rules.effective_input_s(fast_alone) == pytest.approx(0.04 + step)  # prefetched
    # The input alone read slow, the real step did not wait: not input.
    slow_alone = measured(input_s=0.05, real_s=0.011, real_wait_s=0.0)
    assert rules.verdict(slow_alone) == "compute" and "disagree" in rules.disagreement(slow_alone)


def test_fixes_come_with_predicted_gains():
    slow_input = measured(
        input_s=0.05,
        real_s=0.061,
        real_wait_s=0.05,
        pipeline=[("TensorSlice", None), ("Map", 1), ("Batch", None)],
    )
    fixes = fix_rules.fixes(slow_input)
    assert "num_parallel_calls" in fixes[0].action and fixes[0].gain > 1.3
    assert fixes[-1].condition  # the cache is ranked after the unconditional fixes
    host = fix_rules.fixes(measured(step_s=0.0001, call_overhead_s=0.002, steps_per_loop=1))
    assert host[0].stage == "host" and "steps_per_loop" in host[0].action and host[0].gain > 2
    comm = fix_rules.fixes(measured(replicas=2, all_reduce_s=0.008))
    assert "accumulate_steps=" in comm[0].action and comm[0].gain > 1.3
    assert fix_rules.accumulation_for(measured(replicas=2, all_reduce_s=0.008)) >= 2
    # 64 × 1 MFLOP / 10 ms = 6.4 GFLOP/s against a 10 GFLOP/s peak: nothing to gain.
    near_peak = fix_rules.fixes(measured())
    assert near_peak[0].software is False and "64%" in near_peak[0].why


def test_input_fixes_use_their_measured_speedups_and_are_sorted_by_gain():
    m = measured(
        input_s=0.05,
        real_s=0.05,
        real_wait_s=0.04,
        pipeline=[("Tensor", None), ("Generator", 1), ("Map", 1), ("Batch", None)],
        input_speedups={"parallel_source": 3.0, "parallel_map": 1.2},
        source_shards=8,
    )
    fixes = [f for f in fix_rules.fixes(m) if f.stage == "input"]
    unconditional = [f for f in fixes if f.condition is None]
    gains = [f.gain for f in unconditional]
    assert gains == sorted(gains, reverse=True)
    first = fixes[0]
    assert "from_generator(fn, shards=8)" in first.action and first.measured == 3.0
    assert "measured: the pipeline read 3.00x as fast" in first.why
    # Without prefetch the input and the step add up: now ÷ (input ÷ 3 + step).
    now = max(m.real_s, rules.modelled_step_s(m))
    assert first.gain == pytest.approx(now / (0.05 / 3 + rules.cached_step_s(m)))
    assert all(rules.worth_listing(f) for f in fixes)


def test_a_fix_already_in_place_is_never_listed():
    from tfaccel.data.assembly import plan

    x = np.zeros((64, 4), np.float32)
    y = np.zeros(64, np.int64)
    ours = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(x, y), batch_size=8, training=True, preprocess=lambda a, b: (a, b)
    )
    stages = plan.graph_stages(ours)
    assert stages[-1][0] == "Options" and plan.missing(stages) == []
    m = measured(input_s=0.05, real_s=0.05, real_wait_s=0.045, pipeline=stages)
    assert rules.verdict(m) == "input"
    actions = " ".join(f.action for f in fix_rules.fixes(m))
    assert "prefetch" not in actions and "num_parallel_calls=tf.data.AUTOTUNE)" not in actions
    assert "cache()" not in actions and "faster source" in actions


def test_explain_names_what_a_foreign_pipeline_lacks():
    def rows():
        yield from range(4)

    spec = tf.TensorSpec((), tf.int64)
    foreign = tf.data.Dataset.from_generator(rows, output_signature=spec)
    foreign = foreign.map(lambda v: v + tf.random.uniform((), 0, 2, tf.int64)).batch(2)
    text = tfaccel.data.explain(foreign)
    for words in ("parallel reading", "parallelism:", "prefetch:", "cache:"):
        assert f"missing: {words}" in text, text
    done = foreign.cache().prefetch(tf.data.AUTOTUNE)
    assert "missing: prefetch" not in tfaccel.data.explain(done)
    assert "missing: cache" not in tfaccel.data.explain(done)


def test_only_a_map_that_runs_on_one_core_is_called_sequential():
    from tfaccel.data.assembly.plan import graph_stages

    x = tf.data.Dataset.from_tensor_slices(np.zeros((8, 4), np.float32))
    stateless = x.map(tf.sin)  # tf.data's map_parallelization runs it in parallel
    noisy = x.map(lambda a: a + tf.random.uniform(tf.shape(a)))  # stateful: one core
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    assert graph_stages(stateless) == [("TensorSlice", None), ("Map", -1)]
    assert graph_stages(noisy) == [("TensorSlice", None), ("Map", 1)]
    assert graph_stages(stateless.with_options(options))[1] == ("Map", 1)
    assert graph_stages(x.map(tf.sin, num_parallel_calls=3)) == [
        ("TensorSlice", None),
        ("ParallelMap", 3),
    ]


def trainer_and_data(strategy=None, steps_per_loop=1):
    rng = np.random.default_rng(0)
    x = rng.random((256, 8), dtype=np.float32)
    y = rng.integers(0, 3, 256).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)

    def build():
        inputs = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu")(inputs)
        h = keras.layers.BatchNormalization()(h)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))

    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.Adam(1e-2),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy or tf.distribute.get_strategy(),
        steps_per_loop=steps_per_loop,
    )
    return trainer, data


def state(trainer) -> list[np.ndarray]:
    variables = [*trainer.model.variables, *trainer.optimizer.variables, trainer.step]
    variables += [v for m in [trainer.loss_tracker, *trainer.runner.metrics] for v in m.variables]
    return [np.array(v.numpy()) for v in variables]


@pytest.mark.parametrize("replicas", [1, 2])
def test_diagnose_leaves_weights_optimizer_and_counters_as_they_were(replicas, mirrored):
    trainer, data = trainer_and_data(mirrored if replicas == 2 else None)
    trainer.fit(data, epochs=1, verbose=0)  # optimizer slots and counters hold values
    before = state(trainer)
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=3, rounds=1)
    after = state(trainer)
    assert len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)
    assert report.verdict in ("input", "compute", "communication", "host", "memory")
    if replicas == 2:
        assert report.measured.all_reduce_s is not None
    trainer.fit(data, epochs=1, verbose=0)  # and it still trains


def test_report_prints_plots_and_serialises(tmp_path):
    trainer, data = trainer_and_data()
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=3, rounds=1)
    text = str(report)
    assert text.startswith("Verdict: ") and "examples/s" in text and "Fixes" in text
    assert "Precision: " in text
    assert "the only candidate here" in text or "measured under each policy" in text
    path = report.plot(str(tmp_path / "doctor.png"))
    assert (tmp_path / "doctor.png").stat().st_size > 1000 and path.endswith(".png")
    data_dict = json.loads(json.dumps(report.to_dict(), default=str))
    assert data_dict["verdict"] == report.verdict and data_dict["fixes"]
    assert report.cost_s > 0


def test_deep_measures_xla_and_leaves_the_state_as_it_was():
    trainer, data = trainer_and_data()
    trainer.fit(data, epochs=1, verbose=0)
    before = state(trainer)
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=2, rounds=1, deep=True)
    for old, new in zip(before, state(trainer), strict=True):
        np.testing.assert_array_equal(old, new)
    speedup = report.measured.xla_speedup
    assert speedup is not None and speedup > 0
    assert f"XLA (deep=True): the forward and backward passes ran {speedup:.2f}x" in str(report)
    jit = [i for i, f in enumerate(report.fixes, 1) if "jit_compile" in f.action]
    assert bool(jit) == (speedup >= rules.MIN_GAIN)  # listed exactly where it measured a gain
    assert (f"(fix {jit[0]})" if jit else "threshold: not listed") in str(report)
    with pytest.raises(ValueError, match="deep"):
        tfaccel.doctor.diagnose(trainer, data, deep="yes")


@pytest.mark.parametrize("stage", ["host", "input", "compute"])
def test_a_measured_gain_over_the_threshold_is_listed_whatever_the_verdict(stage):
    # Fake timings: the passes 1.24x faster under XLA, the job limited by `stage`, where
    # compute is so small a share of the step that the predicted whole-step gain is ~1.
    timings = {
        "host": dict(step_s=0.001, call_overhead_s=0.5, steps_per_loop=1),
        "input": dict(step_s=0.001, input_s=0.5, real_s=0.5, real_wait_s=0.49),
        "compute": dict(step_s=0.5),
    }[stage]
    m = measured(xla_speedup=1.24, **timings)
    assert rules.verdict(m) == stage
    jit = [f for f in fix_rules.fixes(m) if "jit_compile" in f.action]
    assert len(jit) == 1 and jit[0].measured == 1.24
    assert rules.worth_listing(jit[0])
    for below in (1.0, rules.MIN_GAIN - 0.001):
        m = measured(xla_speedup=below, **timings)
        assert not any("jit_compile" in f.action for f in fix_rules.fixes(m))


def test_a_measured_precision_gain_is_a_ranked_compute_fix():
    faster = measured(precision_rates={"float32": 100.0, "mixed_bfloat16": 240.0}, step_s=0.2)
    assert rules.verdict(faster) == "compute"
    fix = fix_rules.fixes(faster)[0]
    assert 'precision="auto"' in fix.action and "mixed_bfloat16" in fix.action
    assert fix.measured == pytest.approx(2.4) and fix.gain > 1.5 and "2.40x" in fix.why
    slower = measured(precision_rates={"float32": 100.0, "mixed_bfloat16": 103.0}, step_s=0.2)
    assert not any("precision" in f.action for f in fix_rules.fixes(slower))


def test_no_software_fix_only_after_precision_was_measured_and_lost():
    near_peak = dict(step_s=0.2, flops_per_example=1e9, matmul_peak=1e9 * 64 / 0.2 / 0.9)
    lost = measured(precision_rates={"float32": 100.0, "mixed_bfloat16": 90.0}, **near_peak)
    assert fix_rules.fixes(lost)[0].software is False  # measured, lost: nothing applies
    won = measured(precision_rates={"float32": 100.0, "mixed_bfloat16": 300.0}, **near_peak)
    assert all(f.software for f in fix_rules.fixes(won))
    assert "precision" in fix_rules.fixes(won)[0].action


def test_the_doctor_times_each_precision_the_hardware_offers(monkeypatch):
    from tfaccel.choices import policy

    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    trainer, data = trainer_and_data()
    trainer.fit(data, epochs=1, verbose=0)
    before = state(trainer)
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=2, rounds=1)
    for old, new in zip(before, state(trainer), strict=True):
        np.testing.assert_array_equal(old, new)
    rates = report.measured.precision_rates
    assert set(rates) == {"float32", "mixed_bfloat16"} and all(r > 0 for r in rates.values())
    listed = [f for f in report.fixes if "precision" in f.action]
    speedup = rates["mixed_bfloat16"] / rates["float32"]
    assert bool(listed) == (speedup >= rules.MIN_GAIN)  # one rule decides, whatever the timing
    assert "measured under each policy" in str(report)


def test_a_measured_xla_gain_becomes_the_first_compute_fix():
    faster = fix_rules.fixes(measured(xla_speedup=2.0))
    assert "jit_compile=True" in faster[0].action and faster[0].gain > 1.5
    assert "2.00x" in faster[0].why
    slower = fix_rules.fixes(measured(xla_speedup=0.5))  # measured slower: not offered
    assert not any("jit_compile" in f.action for f in slower)
    gpu = dict(device="GPU", matmul_peak=None, flops_per_example=None)
    assert any("jit_compile" in f.action for f in fix_rules.fixes(measured(**gpu)))  # unmeasured
    assert not any(
        "jit_compile" in f.action for f in fix_rules.fixes(measured(xla_speedup=0.9, **gpu))
    )


def test_a_compiled_model_is_diagnosed_in_place():
    trainer, data = trainer_and_data()
    model = trainer.model
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    before = [np.array(v.numpy()) for v in model.variables]
    report = tfaccel.doctor.diagnose(model, data, budget_s=3, rounds=1)
    assert report.measured.steps_per_loop == 4 and not report.measured.trainer
    for old, v in zip(before, model.variables, strict=True):
        np.testing.assert_array_equal(old, v.numpy())


def test_bad_targets_and_arguments_are_named():
    trainer, data = trainer_and_data()
    with pytest.raises(TypeError, match="Trainer or a compiled keras.Model"):
        tfaccel.doctor.diagnose("model", data)
    with pytest.raises(ValueError, match="not compiled"):
        tfaccel.doctor.diagnose(keras.Sequential([keras.layers.Dense(1)]), data)
    with pytest.raises(ValueError, match="budget_s"):
        tfaccel.doctor.diagnose(trainer, data, budget_s=0)
    with pytest.raises(ValueError, match="rounds"):
        tfaccel.doctor.diagnose(trainer, data, rounds=0)
    with pytest.raises(ValueError, match="unbatched"):
        tfaccel.doctor.diagnose(trainer, data.unbatch())
