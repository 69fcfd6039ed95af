"""Tuning declines at its first reading when the next probe cannot fit (fake timings)."""

from __future__ import annotations

import re
import types

import keras
import numpy as np
import pytest

from tfaccel import tuning
from tfaccel.tuning import joint
from tfaccel.tuning.batch import budget, early
from tfaccel.tuning.batch.report import BatchSizeReport, ProbeRow
from tfaccel.tuning.lr import finder

X = np.random.default_rng(2).normal(size=(512, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("int32")
SCE = keras.losses.SparseCategoricalCrossentropy()


class FakeClock:
    """A clock set by hand (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_first_reading_says_from_what_job_size_the_next_probe_fits():
    clock = FakeClock()
    rows = [ProbeRow(8, True, 800.0, 1.0, "ok", seconds=0.5)]  # fixed cost 0.5 - 3*8/800
    limit = budget.TimeLimit(0.0, None, 80_000, clock=clock)
    clock.now = 2.0
    assert limit.spent(rows, 32, steps=2)
    why = budget.declined(limit, rows, 32, steps=2)
    # 2 s spent + 0.47 s fixed + 3 steps of 32 at 800/s = 2.59 s; batch 32 may reach
    # 3,200/s, so the job must be 2.59 s / 7.5 % at 3,200/s: 110,507 examples
    assert why == (
        "declined at the first reading, after 2 s (2.0% of the job's 100 s): a probe of "
        "batch 32 would take 0.59 s more, past 7.5% of the job; from 110,507 examples up, "
        "a probe of batch 32 fits"
    )
    assert not budget.TimeLimit(0.0, None, 110_507, clock=clock).spent(rows, 32, steps=2)
    assert budget.TimeLimit(0.0, None, 110_000, clock=clock).spent(rows, 32, steps=2)


def test_a_time_budget_that_binds_says_what_budget_would_do():
    clock = FakeClock()
    rows = [ProbeRow(8, True, 800.0, 1.0, "ok", seconds=0.5)]
    limit = budget.TimeLimit(0.0, 1.0, None, clock=clock)
    clock.now = 0.9
    why = budget.declined(limit, rows, 16, steps=2, reserve=lambda seconds: 0.25)
    assert why == (
        "declined at the first reading, after 0.9 s: a probe of batch 16 would take 0.53 s "
        "more, past budget_s=1; from budget_s=1.7 up it fits"
    )


class StepClock:
    """Every read advances 1 s: a step of any batch takes 1 s (8 examples/s at batch 8)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def build():
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]
    )


def test_find_batch_size_stops_at_its_first_reading_and_reports_the_threshold(monkeypatch):
    monkeypatch.setattr(early, "project", lambda *args: None)  # the forward pass lets it run
    report = tuning.find_batch_size(
        build,
        (X, Y),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        start=8,
        steps=2,
        job_examples=500,  # 62.5 s at 8 examples/s: the next probe's 3 steps (6 s) pass 7.5 %
        clock=StepClock(),
    )
    assert [(r.batch_size, r.reason) for r in report.rows] == [(8, "ok"), (16, "time")]
    assert report.capped_by == "time" and report.best_batch_size == 8
    assert report.rows[0].examples_per_second == pytest.approx(8.0)
    assert re.fullmatch(
        r"declined at the first reading, after [\d.e+-]+ s \([\d.]+% of the job's 62.5 s\): a "
        r"probe of batch 16 would take [\d.e+-]+ s more, past 7\.5% of the job; from "
        r"[\d,]+ examples up, a probe of batch 16 fits",
        report.declined,
    )
    threshold = int(re.search(r"from ([\d,]+) examples", report.declined)[1].replace(",", ""))
    assert threshold > 6 * 16 / 0.075  # at least the next probe's 3 steps at up to 16/s
    assert report.declined in report.table()
    kept = tuning.recommend(report, batch_size=8, learning_rate=0.01, optimizer="sgd")
    assert kept.kept and report.declined in kept.reason
    assert BatchSizeReport.from_dict(report.to_dict()).declined == report.declined


def ramp_with(clock, budget_s):
    ramp = finder.LRRangeTest(
        types.SimpleNamespace(set=lambda rate: None), 1e-4, 1.0, 100, budget_s, clock=clock
    )
    ramp.set_model(types.SimpleNamespace(stop_training=False))
    ramp.on_train_begin()
    for step, now in enumerate([1.0, 1.1, 1.2]):  # the first step traces: 1 s; then 0.1 s
        clock.now = now
        ramp.on_train_batch_begin(step)
        ramp.on_train_batch_end(step, {"loss": 1.0})
    return ramp


def test_the_range_test_declines_at_its_first_timed_steps():
    clock = FakeClock()
    ramp = ramp_with(clock, budget_s=5.0)
    assert ramp.stopped == "declined" and ramp.model.stop_training and ramp.done == 3
    assert ramp.declined == (
        "declined after 3 steps (1.2 s): the ramp of 100 steps projects 11 s, past "
        "budget_s=5; from budget_s=11 up it runs"
    )
    control = types.SimpleNamespace(schedule=None)
    report = finder._report(ramp, control, 1.2)
    assert report.suggestion is None and report.reason == ramp.declined
    assert report.stopped == "declined"
    fits = ramp_with(FakeClock(), budget_s=11.0)  # 1.2 s + 97 steps of 0.1 s = 10.9 s
    assert fits.declined is None and not fits.model.stop_training


def test_tune_skips_a_range_test_its_first_reading_projects_past_the_bound(monkeypatch):
    # The batch search's first reading: batch 16 at 1,600 examples/s, built and traced in
    # 2 s. The range test would take 2 s + 100 steps of 10 ms = 3 s; 10 % of a job of
    # 40,000 examples at 1,600/s is 2.5 s.
    rows = [ProbeRow(16, True, 1600.0, 1.0, "ok", seconds=2.06)]
    report = BatchSizeReport(16, 16, rows, "power", 0.05, None, "host", 2.1)

    def no_range_test(*args, **kwargs):
        raise AssertionError("the range test ran")

    monkeypatch.setattr(joint, "find_batch_size", lambda *args, **kwargs: report)
    monkeypatch.setattr(joint, "find_learning_rate", no_range_test)
    tuned = tuning.tune(
        build, (X, Y), loss=SCE, batch_size=16, learning_rate=1e-3, job_examples=40_000,
        lr_steps=100, verbose=0,
    )  # fmt: skip
    assert tuned.rate_report is None and tuned.learning_rate == 1e-3
    found = re.fullmatch(
        r"the range test was skipped at the batch search's first reading: it would take 3 s "
        r"\(a build and trace of 2 s, 100 steps at batch 16\), more than the ([\d.]+) s left "
        r"of the bound \(10% of the job\); from ([\d,]+) examples up it fits",
        tuned.note,
    )
    # 2.5 s less what tune spent before (real seconds: converting the data, a few ms on a
    # quiet machine); the threshold is (3 s + that) / 10 % at 1,600 examples/s
    left, threshold = float(found[1]), int(found[2].replace(",", ""))
    spent = 2.5 - left
    assert 0 <= spent < 5 and 48_000 <= threshold < 48_000 + 16_000 * (spent + 0.1)


def test_the_range_test_declines_a_job_too_short_for_it_and_says_from_what_size():
    clock = FakeClock()
    ramp = finder.LRRangeTest(
        types.SimpleNamespace(set=lambda rate: None), 1e-4, 1.0, 50, job_steps=500, batch=16,
        clock=clock,
    )  # fmt: skip
    ramp.set_model(types.SimpleNamespace(stop_training=False))
    ramp.on_train_begin()
    for step, now in enumerate([0.5, 0.5625, 0.625]):  # traced in 0.5 s, then 62.5 ms a step
        clock.now = now
        ramp.on_train_batch_begin(step)
        ramp.on_train_batch_end(step, {"loss": 1.0})
    # 0.625 s + 47 steps of 62.5 ms = 3.5625 s, past 5 % of 500 steps of 62.5 ms (1.5625 s);
    # it fits 5 % of 1,140 steps: 18,240 examples at batch 16
    assert ramp.stopped == "declined" and ramp.declined == (
        "declined after 3 steps (0.62 s, 2.0% of the job's 31 s): the ramp of 50 steps "
        "projects 3.6 s, past 5% of the job; from 18,240 examples up it runs"
    )


def test_the_forward_reading_projects_the_least_search_and_its_threshold():
    reading = early.ForwardReading(8, trace_s=0.1, forward_s=0.001)
    assert reading.fixed_s == pytest.approx(1.4)  # 0.3 s + 11 x the forward trace
    assert reading.examples_per_second == pytest.approx(8 / 0.003)  # a step: 3 forwards
    # three traces (4.2 s), 3 steps at 8 and at 16, each timed twice (54 ms), the noise
    # scale's 16 x (8 x 8 + 64) examples (0.768 s)
    least = early.least_search_s(reading, steps=2, examples=512, noise=True)
    assert least == pytest.approx(5.022)
    # with a warm-up of one pass (512 examples: 0.192 s) and 0.5 s spent: 5.714 s, 7.5 %
    # of a job of 76.19 s: 203,165 examples
    why = early.project(reading, 0.5, 195_000, 2, 512, warmup=512)
    assert why == (
        "declined at the first reading (the forward pass, before any training step), after "
        "0.5 s (0.7% of the job's 73.1 s, projected): a search (batches 8 and 16, the noise "
        "scale and its warm-up; traces of about 1.4 s each) would take 5.2 s more, past 7.5% "
        "of the job; from 203,165 examples up, a search fits"
    )
    assert early.project(reading, 0.5, 203_165, 2, 512, warmup=512) is None
    assert early.project(reading, 0.5, None, 2, 512, warmup=512) is None  # budget_s alone
    # a warm-up past its half of the limit shrinks to it: 5.522 s / (0.5 x 7.5 %) = 147.25 s
    assert early.project(reading, 0.5, 392_675, 2, 512, warmup=50_000).endswith(
        "from 392,676 examples up, a search fits"
    )
    assert early.project(reading, 0.5, 392_676, 2, 512, warmup=50_000) is None
    # without the noise scale or the second timing: two traces and 3 steps at 8 and 16
    assert early.least_search_s(reading, 2, 512, noise=False, confirm=False) == pytest.approx(2.827)


def fake_reading(monkeypatch, trace_s=0.1, forward_s=0.001):
    calls = []

    def read(model, x, batch, clock=None, training=True):
        calls.append((batch, training))
        return early.ForwardReading(batch, trace_s, forward_s)

    monkeypatch.setattr(early, "read_forward", read)
    return calls


def test_find_batch_size_declines_at_the_forward_pass_before_any_training_step(monkeypatch):
    calls = fake_reading(monkeypatch)
    fits = []
    monkeypatch.setattr(keras.Model, "fit", lambda *args, **kwargs: fits.append(1))
    report = tuning.find_batch_size(build, (X, Y), loss=SCE, start=8, steps=2, job_examples=50_000)
    assert calls == [(8, True)] and not fits  # no training step ran
    assert [(r.batch_size, r.reason) for r in report.rows] == [(8, "estimated"), (16, "time")]
    assert report.rows[0].fits_text() == "untried" and report.best_batch_size == 8
    assert report.capped_by == "time"
    assert report.declined.startswith("declined at the first reading (the forward pass")
    assert re.search(r"from [\d,]+ examples up, a search fits$", report.declined)
    kept = tuning.recommend(report, batch_size=8, learning_rate=0.01, optimizer="sgd")
    assert kept.kept and report.declined in kept.reason
    assert "noise scale" not in report.noise_scale_note or "not measured" in report.noise_scale_note


def test_a_forward_pass_that_cannot_be_read_leaves_the_probe_to_decide(monkeypatch):
    def unreadable(*args, **kwargs):
        raise TypeError("a model that needs two inputs")

    monkeypatch.setattr(early, "read_forward", unreadable)
    report = tuning.find_batch_size(
        build, (X, Y), loss=SCE, start=8, steps=2, job_examples=500, clock=StepClock()
    )
    assert report.rows[0].reason == "ok" and report.declined.startswith(
        "declined at the first reading, after"
    )


def test_tune_declines_at_the_forward_pass_without_a_range_test(monkeypatch):
    fake_reading(monkeypatch)
    monkeypatch.setattr(joint, "find_learning_rate", lambda *a, **k: pytest.fail("it ran"))
    tuned = tuning.tune(
        build, (X, Y), loss=SCE, batch_size=16, learning_rate=1e-3, epochs=10, verbose=0
    )
    assert tuned.batch_size == 16 and tuned.learning_rate == 1e-3 and tuned.rate_report is None
    assert "declined at the first reading (the forward pass" in tuned.note


def test_the_range_test_declines_at_its_forward_reading(monkeypatch):
    calls = fake_reading(monkeypatch, trace_s=0.3, forward_s=0.01)  # a step: 30 ms at 16
    model = build()
    model.compile(optimizer="adam", loss=SCE)
    before = [w.copy() for w in model.get_weights()]
    # a 3.6 s trace (0.3 s + 11 x 0.3 s) and 100 steps of 30 ms: 6.6 s, past 5 % of 2,000
    # steps (3 s); 5 % of 4,400 steps is 6.6 s: 70,400 examples
    report = tuning.find_learning_rate(
        model, X, Y, batch_size=16, num_steps=100, job_examples=32_000
    )
    assert calls == [(16, False)]  # inference mode: the model's state is left alone
    assert report.stopped == "declined" and report.steps == 0 and report.suggestion is None
    assert re.fullmatch(
        r"declined at its forward reading, before any step, after [\d.e-]+ s \([\d.]+% of the "
        r"job's 60 s, projected\): the ramp of 100 steps projects 6\.6 s \(a trace of about "
        r"3\.6 s and steps of 0\.03 s, from the forward pass\), past 5% of the job; from "
        r"[\d,]+ examples up it runs",
        report.reason,
    )
    threshold = int(re.search(r"from ([\d,]+) examples", report.reason)[1].replace(",", ""))
    assert 70_400 <= threshold < 70_400 + 16 * 10
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert int(model.optimizer.iterations) == 0
    budgeted = tuning.find_learning_rate(
        model, X, Y, batch_size=16, num_steps=100, job_examples=10**7, budget_s=2.0
    )
    assert budgeted.stopped == "declined" and "past budget_s=2" in budgeted.reason
