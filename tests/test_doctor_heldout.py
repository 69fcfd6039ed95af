"""benchmarks/doctor_heldout.py: the doctor's first fix, applied to a held-out job as a
model.fit user would, is what ran; the ratios are the recorded times' (no timing asserts)."""

from __future__ import annotations

import json
import math
import pathlib
import sys

import keras
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))

import doctor_heldout as bench  # noqa: E402  (benchmarks/doctor_heldout.py)
import heldout_jobs  # noqa: E402

from tfaccel.doctor import Fix  # noqa: E402

JOB = "structured_mlp_hastie"  # the smallest held-out job


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("doctor_heldout") / "toy.json"
    document = bench.main(["--toy", "--jobs", JOB, "--seeds", "1", "--json", str(out)])
    return document, json.loads(out.read_text())


def test_toy_run_records_the_first_fix_and_both_runs(toy):
    document, written = toy
    assert written["meta"]["seeds"] == [0] and written["meta"]["toy"] is True
    assert "separately" in written["meta"]["doctor_cost_counted"]
    entry = document["jobs"][JOB]
    report = entry["report"]
    assert entry["verdict"] == report["verdict"]
    if report["fixes"]:  # the first fix recorded is the report's first
        assert entry["first_fix"]["action"] == report["fixes"][0]["action"]
        assert entry["first_fix"]["gain"] == report["fixes"][0]["gain"]
    assert entry["doctor_cost_s"] > 0
    without = entry["runs"][0]["without"]
    assert "error" not in without and without["dtype_policy"] == "float32"
    if entry["applied"]["skipped"]:  # never faked: no run with it, the reason said
        assert "with" not in entry["runs"][0] and "ratio" not in entry
        return
    fixed = entry["runs"][0]["with"]
    assert "error" not in fixed, fixed
    code = entry["first_fix"]["code"] or ""
    if "set_global_policy" in code:  # the statement ran: the model's policy changed
        assert fixed["dtype_policy"] in code and fixed["dtype_policy"] != "float32"
    if "steps_per_execution" in code:
        assert fixed["steps_per_execution"] == int(code.split("=")[1])
        assert without["steps_per_execution"] == 1
    if "jit_compile" in code:
        assert fixed["jit_compile"] and not without["jit_compile"]
    # The ratio is time without ÷ time with, from the recorded times.
    a, b = entry["seconds_without"][0], entry["seconds_with"][0]
    assert entry["ratio"]["ratios"][0] == pytest.approx(a / b)
    counted = entry["ratio_with_doctor"]["ratios"][0]
    assert counted == pytest.approx(a / (b + entry["doctor_cost_s"]))


def test_a_precision_fix_changes_the_models_policy():
    """A precision fix's code runs before the build: the model trains in that policy."""
    fix = Fix(
        "compute",
        'keras.mixed_precision.set_global_policy("mixed_bfloat16") before the model is built',
        1.5,
        "measured",
        numerics=True,
        code='keras.mixed_precision.set_global_policy("mixed_bfloat16")',
    )
    applied = bench.plan(fix)
    assert applied.before_build == fix.code and applied.skipped is None
    job, parts = bench.toy_job(heldout_jobs.JOBS[JOB], heldout_jobs.JOBS[JOB].data())
    result = bench.run(job, parts, 0, math.inf, applied)
    assert "error" not in result, result
    assert result["dtype_policy"] == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == "float32"  # no leak


def test_fixes_that_cannot_be_applied_are_skipped_with_a_reason():
    larger = Fix("compute", "a larger batch (tfaccel.tuning.find_batch_size ...)", None, "w")
    assert "no code, batch or dataset" in bench.plan(larger).skipped
    assert "no software fix" in bench.plan(Fix("compute", "none", 1.0, "w", software=False)).skipped
    assert bench.plan(None).skipped
    assert bench.plan(Fix("input", "end the pipeline with .prefetch(x)", 1.2, "w")).dataset
    assert bench.plan(Fix("x", "a batch=64 with a scaled rate", 1.2, "w")).batch == 64


def test_ratio_counts_a_run_that_never_reaches_as_infinitely_slow():
    job = heldout_jobs.JOBS[JOB]
    never = {"curve": [(1.0, 0.1)]}
    reached = {"curve": [(1.0, 0.1), (2.0, 0.99)]}
    entry = {
        "runs": {0: {"without": never, "with": reached}},
        "applied": {"skipped": None},
        "doctor_cost_s": 1.0,
    }
    table = bench.summarize(job, entry, [0], np.random.default_rng(0))
    assert table["seconds_without"] == [math.inf] and table["seconds_with"] == [2.0]
    assert table["ratio"]["ratios"] == [math.inf] and table["paid"] == 1
