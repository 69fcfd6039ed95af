"""The doctor's fixes for a `model.fit` script: Keras code that runs as written, the fixes
that change the numerics said so and ranked after those that keep them (issue 67)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from test_doctor import measured

import tfaccel
from tfaccel.doctor import fix_rules
from tfaccel.doctor import verdict as rules
from tfaccel.doctor.verdict import Fix

FIT = dict(trainer=False)


def _fit_fixes() -> list[Fix]:
    """Every kind of fix the rules give a `model.fit` script."""
    cases = [
        measured(step_s=0.0001, call_overhead_s=0.002, steps_per_loop=1, **FIT),
        measured(replicas=2, all_reduce_s=0.008, **FIT),
        measured(xla_speedup=2.0, step_s=0.2, **FIT),
        measured(precision_rates={"float32": 100.0, "mixed_bfloat16": 240.0}, step_s=0.2, **FIT),
        measured(device="GPU", gpu_capability=(8, 0), **FIT),
        measured(memory={"peak_mb": 990.0, "capacity_mb": 1000.0, "what": "RAM"}, **FIT),
    ]
    return [f for m in cases for f in fix_rules.fixes(m)]


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_fit_scripts_fixes_speak_keras_or_name_the_port():
    for fix in _fit_fixes():
        if "Trainer(" in fix.action:
            assert fix.action.startswith("tfaccel.Trainer(model, "), fix.action
            assert "one-line port to the Trainer" in fix.action, fix.action
        assert 'precision="auto"' not in fix.action  # a Trainer argument, not Keras
    actions = " ".join(f.action for f in _fit_fixes())
    assert 'keras.mixed_precision.set_global_policy("mixed_bfloat16")' in actions
    assert "model.compile(..., steps_per_execution=" in actions
    assert "model.compile(..., jit_compile=True)" in actions


def test_a_fit_scripts_fix_code_runs_as_keras():
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = np.arange(32) % 3
    codes = [f.code for f in _fit_fixes() if f.code]
    assert len(codes) >= 5
    try:
        for code in codes:
            model = _model()
            exec(code, {"keras": keras, "tfaccel": tfaccel, "model": model})  # noqa: S102
            if "set_global_policy" in code:
                model = _model()  # the policy holds for a model built after it
                assert model.layers[0].compute_dtype != "float32"
            if code.startswith("trainer ="):
                continue  # the Trainer: a port, tested in test_trainer
            history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
            assert np.isfinite(history.history["loss"][0]), code
        spe = next(c for c in codes if "steps_per_execution" in c)
        model = _model()
        exec(spe, {"model": model})  # noqa: S102
        assert model.steps_per_execution == int(spe.split("=")[1])
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_port_to_the_trainer_runs_as_written():
    for code in {f.code for f in _fit_fixes() if f.code and f.code.startswith("trainer =")}:
        namespace = {"keras": keras, "tfaccel": tfaccel, "model": _model()}
        exec(code, namespace)  # noqa: S102
        k = int(code.split("accumulate_steps=")[1].rstrip(")"))
        x = np.zeros((8 * k, 4), "float32")
        namespace["trainer"].fit(x, np.zeros(8 * k, "int32"), batch_size=8, epochs=1, verbose=0)


def test_fixes_that_change_the_numerics_say_so_and_rank_after_those_that_keep_them():
    both = measured(
        xla_speedup=1.3,
        precision_rates={"float32": 100.0, "mixed_bfloat16": 200.0},
        step_s=0.2,
    )
    listed = fix_rules.fixes(both)
    xla = next(i for i, f in enumerate(listed) if "jit_compile" in f.action)
    bf16 = next(i for i, f in enumerate(listed) if "precision" in f.action)
    assert listed[bf16].gain > listed[xla].gain and xla < bf16  # numerics decide, then gain
    assert listed[bf16].numerics and not listed[xla].numerics
    assert "changes the numerics" in listed[bf16].line()
    assert "changes the numerics" not in listed[xla].line()
    comm = fix_rules.fixes(measured(replicas=2, all_reduce_s=0.008))
    assert all(f.numerics for f in comm if f.stage == "communication")


@pytest.mark.parametrize("trainer", [True, False])
def test_the_precision_fix_names_the_policy_it_measured(trainer):
    m = measured(
        precision_rates={"float32": 100.0, "mixed_bfloat16": 240.0}, step_s=0.2, trainer=trainer
    )
    fix = fix_rules.fixes(m)[0]
    assert "mixed_bfloat16" in fix.action and fix.numerics
    assert (fix.code is None) == trainer
    assert rules.verdict(m) == "compute"
