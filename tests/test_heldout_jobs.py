"""Held-out jobs (benchmarks/heldout_jobs.py): never read by the choice, and they still run.

The stacks, thresholds and defaults of `methods="fast"` are chosen on the choice jobs of
`benchmarks/time_to_accuracy.py`; the held-out jobs measure what a new user gets, so nothing
that chooses may name them. Each held-out job must also still build and take a step.
"""

from __future__ import annotations

import inspect
import json
import math
import pathlib
import sys

import keras
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import heldout_jobs  # noqa: E402
import time_to_accuracy  # noqa: E402
import time_to_accuracy_heldout as harness  # noqa: E402

HELD_OUT_NAMES = (*heldout_jobs.JOBS, "heldout_jobs", "time_to_accuracy_heldout")


def named(text: str) -> list[str]:
    """The held-out jobs' names (or modules') that `text` mentions."""
    return [name for name in HELD_OUT_NAMES if name in text]


def choice_texts() -> dict[str, str]:
    """What chooses: tfaccel's code (composition.py, the methods and the rest) and the choice
    jobs' code and data (their names, functions and recorded results)."""
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "tfaccel").rglob("*.py")}
    for name, job in time_to_accuracy.JOBS.items():
        code = "".join(inspect.getsource(job[part]) for part in ("data", "build"))
        texts[f"time_to_accuracy.JOBS[{name!r}]"] = name + code
    results = ROOT / "benchmarks" / "results" / "time_to_accuracy.json"
    texts[str(results.relative_to(ROOT))] = results.read_text()
    return texts


def test_no_choice_code_or_data_names_a_held_out_job():
    texts = choice_texts()
    assert "tfaccel/methods/composition.py" in texts  # the stack choice itself is read
    found = {where: named(text) for where, text in texts.items() if named(text)}
    assert not found, f"the choice names held-out jobs: {found}"


def test_the_check_finds_a_held_out_name_planted_in_choice_code():
    planted = f"FAST = {{'{next(iter(heldout_jobs.JOBS))}': ...}}  # import heldout_jobs"
    assert named(planted) == [next(iter(heldout_jobs.JOBS)), "heldout_jobs"]
    assert named("FAST = {'image': ...}") == []


def test_held_out_and_choice_jobs_are_disjoint_and_held_out_jobs_are_four_kinds():
    assert not set(heldout_jobs.JOBS) & set(time_to_accuracy.JOBS)
    assert len({job.kind for job in heldout_jobs.JOBS.values()}) >= 4
    for job in heldout_jobs.JOBS.values():
        assert job.source.startswith("https://keras.io/examples/")
        assert 0.5 < job.target < 1.0 and job.needed_epochs >= 1


@pytest.mark.parametrize("name", list(heldout_jobs.JOBS))
def test_each_held_out_job_builds_and_takes_one_step(name):
    job = heldout_jobs.JOBS[name]
    xt, xv, yt, yv = job.data()
    assert len(xt) > len(xv) > 0 and xt.shape[1:] == xv.shape[1:]
    keras.utils.set_random_seed(0)
    model = job.build()
    model.compile(optimizer=job.recipe.optimizer(), loss=job.loss, metrics=["accuracy"])
    loss, accuracy = model.train_on_batch(xt[:4], yt[:4])
    assert math.isfinite(loss) and 0.0 <= accuracy <= 1.0
    assert model.predict(xv[:2], verbose=0).shape[0] == 2
    callbacks = job.recipe.callbacks() if job.recipe.callbacks else []
    assert all(isinstance(c, keras.callbacks.Callback) for c in callbacks)


def test_the_recipe_is_the_plain_script_only_at_adams_default_batch_32_and_no_callback():
    assert heldout_jobs.Recipe(batch=32, epochs=50).same_as_naive()
    assert not heldout_jobs.Recipe(batch=128, epochs=15).same_as_naive()
    assert not heldout_jobs.Recipe(batch=32, epochs=2, learning_rate=3e-3).same_as_naive()
    assert not heldout_jobs.Recipe(batch=32, epochs=9, callbacks=list).same_as_naive()


def test_the_baselines_run_declared_10x_stand_for_shorter_declarations(monkeypatch):
    job = heldout_jobs.HeldOutJob(
        name="toy",
        kind="toy",
        source="https://keras.io/examples/toy/",
        data=lambda: None,
        build=lambda: None,
        loss="mse",
        recipe=heldout_jobs.Recipe(batch=128, epochs=4),
        target=0.9,
        needed_epochs=2,
    )
    monkeypatch.setitem(heldout_jobs.JOBS, "toy", job)
    naive = {0: [(1.0, 0.5), (2.0, 0.8), (3.0, 0.9)], 1: [(1.0, 0.6), (2.0, 0.95)]}
    recipe = {0: [(1.0, 0.9)], 1: [(2.0, 0.7), (4.0, 0.92)]}
    fast = {0: [(0.5, 0.91)], 1: [(1.0, 0.93)]}
    by_key = {
        "naive@10x": {s: {"curve": c} for s, c in naive.items()},
        "recipe@10x": {s: {"curve": c} for s, c in recipe.items()},
        "fast_naive@1x": {s: {"curve": c} for s, c in fast.items()},
        "fast_recipe@1x": {s: {"curve": c} for s, c in fast.items()},
    }
    table = harness.summarize({"toy": {"fit": by_key}}, [0, 1], [1], ["fit"])["toy"]["fit@1x"]
    # Declared 1x (2 epochs): seed 0's plain script reaches 0.9 only at its third epoch.
    assert table["contenders"]["naive"]["seconds"] == [math.inf, 2.0]
    assert table["contenders"]["recipe"]["seconds"] == [1.0, 4.0]
    ratios = table["ratios"]
    assert ratios["fast_naive/naive"]["ratios"] == [0.0, 0.5]  # seed 0: only fast reached
    assert ratios["fast_recipe/recipe"]["median"] == pytest.approx(np.median([0.5, 0.25]))
    assert ratios["recipe/naive"]["ratios"] == [0.0, 2.0]
    neither = harness.summarize(
        {"toy": {"fit": {**by_key, "fast_naive@1x": {0: {"error": "E"}, 1: {"curve": []}}}}},
        [0, 1],
        [1],
        ["fit"],
    )["toy"]["fit@1x"]
    assert neither["contenders"]["fast_naive"]["errors"] == ["E"]
    assert math.isnan(neither["ratios"]["fast_naive/naive"]["ratios"][0])  # neither reached
    json.dumps(table)  # what the harness writes


def test_a_job_whose_recipe_is_the_plain_script_reads_its_naive_runs():
    job = heldout_jobs.JOBS["structured_mlp_hastie"]
    assert job.recipe.same_as_naive()
    assert harness.planned(job, [1, 3]) == [
        ("naive", 10),
        ("fast_naive", 1),
        ("fast_naive", 3),
    ]
    runs = {"naive@10x": {0: {"curve": [(1.0, 0.9)] * 30}}}
    assert len(harness.lookup(job, runs, "recipe", 1, 0)["curve"]) == job.needed_epochs


def test_a_declared_length_compares_only_with_seeds_that_reached_at_1x():
    job = heldout_jobs.JOBS["structured_mlp_hastie"]  # its recipe is the plain script
    curves = {
        "naive@10x": {0: [(1.0, 0.95)], 1: [(1.0, 0.95)]},
        "fast_naive@1x": {0: [(1.0, 0.5)] * 28, 1: [(2.0, 0.95)]},
        "fast_naive@3x": {0: [(3.0, 0.95)], 1: [(3.0, 0.95)]},
    }
    by_key = {k: {s: {"curve": c} for s, c in v.items()} for k, v in curves.items()}
    table = harness.summarize({job.name: {"fit": by_key}}, [0, 1], [1, 3], ["fit"])
    ratio = table[job.name]["fit@3x"]["ratios"]["fast_naive@3x/fast_naive@1x"]
    assert math.isnan(ratio["ratios"][0]) and ratio["ratios"][1] == 1.5  # seed 0: 1x missed
    assert ratio["median"] == 1.5
    recipes = table[job.name]["fit@3x"]["ratios"]["fast_recipe@3x/fast_recipe@1x"]
    assert recipes["median"] == 1.5  # the recipe is the plain script: the same runs
