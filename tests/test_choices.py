"""tfaccel.choices: one protocol for every measured choice, one entry the Trainer calls after
its input is checked, and the old import paths kept (warning, naming the new one)."""

from __future__ import annotations

import importlib
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import precision
from tfaccel.choices import Choice, policy, resolution, timing
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.choices.policy import PolicyChoice
from tfaccel.choices.xla import XlaChoice

X = np.random.default_rng(0).random((64, 6), dtype=np.float32)


def build():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])


# -- one protocol ------------------------------------------------------------------------


def test_every_choice_is_a_value_a_reason_figures_and_a_cost():
    rates = {"float32": 100.0, "mixed_bfloat16": 200.0}
    chosen = PolicyChoice("mixed_bfloat16", "2.00x float32", rates, "examples/s", cost_s=1.5)
    jit = XlaChoice(True, "XLA 1.30x", {"plain": 100.0, "XLA": 130.0}, cost_s=2.0)
    assert isinstance(chosen, Choice) and isinstance(jit, Choice)
    assert (chosen.value, chosen.policy, chosen.rates, chosen.cost_s) == (
        "mixed_bfloat16",
        "mixed_bfloat16",
        rates,
        1.5,
    )
    assert chosen.describe() == (
        "mixed_bfloat16 (2.00x float32; float32 100 examples/s, mixed_bfloat16 200 examples/s)"
    )
    assert jit.jit_compile is True and jit.unit == "examples/s"
    assert jit.describe() == "True (XLA 1.30x; plain 100 examples/s, XLA 130 examples/s)"
    assert precision.Choice is PolicyChoice  # the public name, the same class


def test_steps_per_loop_is_a_choice_too_with_the_table_s_words():
    fixed = LoopSizer(8)
    assert fixed.choice(5) == Choice(5, "given") and fixed.describe(5) == 5
    auto = LoopSizer("auto")
    assert auto.choice().describe() == "auto (measured over the first loops)"
    for asked, seconds in [(1, 0.5), (1, 0.011)] + [(90, 0.1), (1, 0.011)] * 4 + [(90, 0.1)]:
        auto.record(asked, asked, seconds)
    measured = auto.choice()
    assert measured.value == auto.chosen and set(measured.figures) == {
        "overhead_s",
        "step_s",
        "jitter_s",
    }
    assert measured.cost_s > 0 and auto.describe() == measured.describe()
    assert measured.describe().startswith(f"{auto.chosen} (auto: host overhead ")


def test_tfaccel_precision_keeps_its_public_names():
    for name in precision.__all__:
        assert getattr(precision, name) is not None
    assert precision.choose is policy.choose and precision.candidates is policy.candidates
    assert precision.decide is policy.decide


# -- one entry, after the input is checked ----------------------------------------------------


def test_resolve_fit_takes_what_it_needs_not_the_trainer():
    feed = types.SimpleNamespace(is_function=False, steps=4)
    step = resolution.Step(build(), None, tf.distribute.get_strategy())
    job = resolution.Job(feed, None, 3)
    assert (job.epoch_steps, job.steps) == (4, 12)
    made = resolution.resolve_fit(step, resolution.Asked(), job, LoopSizer("auto"))
    assert made.precision is None and made.jit_compile is None
    assert made.steps_per_loop == Choice("auto", "measured over the first loops")
    left = resolution.Asked(True, True).left(PolicyChoice("float32", "x"), None)
    assert left == resolution.Asked(precision=False, jit_compile=True)


def test_the_input_is_checked_before_anything_is_measured(monkeypatch):
    def measured(*args, **kwargs):
        raise AssertionError("measured before the input was checked")

    monkeypatch.setattr(policy, "candidates", lambda: (["float32", "mixed_bfloat16"], "x"))
    monkeypatch.setattr(policy, "choose", measured)
    monkeypatch.setattr(timing, "time_steps", measured)
    labels = np.ones((64, 4), dtype=np.int32)  # not one class index per example
    data = tf.data.Dataset.from_tensor_slices((X, labels)).batch(8)
    trainer = tfaccel.Trainer(build, loss="sparse_categorical_crossentropy", precision="auto")
    with pytest.raises(ValueError, match="one integer class index per example"):
        trainer.fit(data, epochs=200, verbose=0)  # 1,600 steps: long enough to time


# -- old paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("tfaccel.precision_probe", "tfaccel.choices.operations", "cached_rates"),
        ("tfaccel.train.step.precision_step", "tfaccel.choices.policy", "by_operations"),
        ("tfaccel.train.step.precision_step", "tfaccel.choices.copies", "under"),
        ("tfaccel.train.step.passes", "tfaccel.choices.passes", "GradientLoops"),
        ("tfaccel.train.setup.xla_choice", "tfaccel.choices.xla", "XlaChoice"),
        ("tfaccel.train.loop.loop_size", "tfaccel.choices.loop_size", "LoopSizer"),
        ("tfaccel.train.loop.agreement", "tfaccel.choices.agreement", "agree"),
    ],
)
def test_an_old_path_warns_with_the_new_one_and_still_works(monkeypatch, old, new, name):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to .*{new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="moved to"):
        module.no_such_name  # noqa: B018
