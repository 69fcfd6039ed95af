"""The tuners' one argument head (issue 70): a `TuningJob`, or its fields as keywords; the
search's settings as a `BatchSearch`, the range test's ramp as an `LRRamp`, or theirs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import tuning
from tfaccel.tuning import joint
from tfaccel.tuning.batch import largest
from tfaccel.tuning.job import job_from

SCE = "sparse_categorical_crossentropy"
X = np.random.default_rng(0).random((256, 8)).astype("float32")
Y = (X.sum(axis=1) > 4).astype("int32")


def build():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])


def test_a_job_is_the_same_given_as_an_object_or_as_its_fields():
    strategy = tf.distribute.get_strategy()
    given = tuning.TuningJob(build, (X, Y), loss=SCE, strategy=strategy, budget_s=5.0)
    built = job_from("f", build, (X, Y), {"loss": SCE, "strategy": strategy, "budget_s": 5.0})
    assert [getattr(built, n) for n in ("build_model", "loss", "strategy", "budget_s")] == [
        build,
        SCE,
        strategy,
        5.0,
    ]
    assert job_from("f", given, None, {}) is given
    replaced = job_from("f", given, None, {"budget_s": 9.0})
    assert (replaced.budget_s, given.budget_s, replaced.loss) == (9.0, 5.0, SCE)
    assert job_from("f", None, None, {"build_model": build, "data": (X, Y), "loss": SCE}).loss


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: tuning.find_batch_size(build, (X, Y), loss=SCE, strat=1), "did you mean 'start'"),
        (lambda: tuning.find_batch_size(build, (X, Y), loss=SCE, x=1), "fields of TuningJob ("),
        (lambda: tuning.find_batch_size(build, (X, Y)), "missing: loss"),
        (lambda: tuning.find_batch_size(tuning.TuningJob(build, X, SCE), X), "beside a TuningJob"),
        (lambda: tuning.find_batch_size(build, X, loss=SCE, build_model=build), "twice"),
        (lambda: tuning.largest_batch_size(build, X, loss=SCE, knee=0.1), "unexpected keyword"),
        (
            lambda: tuning.tune(build, X, loss=SCE, batch_size=8, learning_rate=1, min_lr=1),
            "tune() got an unexpected keyword argument 'min_lr'",
        ),
        (lambda: tuning.find_learning_rate(build(), X, Y, max_l=1), "did you mean 'max_lr'"),
    ],
)
def test_a_keyword_that_names_no_field_is_refused_before_anything_runs(call, words):
    with pytest.raises(TypeError) as caught:
        call()
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: tuning.TuningJob(build(), (X, Y), SCE), TypeError, "Pass the function"),
        (lambda: tuning.TuningJob(build, (X, Y), SCE, budget_s=-1), ValueError, "budget_s"),
        (lambda: tuning.TuningJob(build, (X, Y), SCE, job_examples=0), ValueError, ">= 1"),
        (lambda: tuning.BatchSearch(steps=0), ValueError, "steps must be an integer >= 1"),
        (lambda: tuning.BatchSearch(memory_budget_mb=0), ValueError, "memory_budget_mb"),
        (lambda: tuning.LRRamp(min_lr=1.0, max_lr=0.1), ValueError, "0 < min_lr < max_lr"),
        (lambda: tuning.LRRamp(num_steps=2.5), TypeError, "num_steps must be an integer"),
        (lambda: tuning.LRRamp(stop_factor=1), ValueError, "stop_factor must be above 1"),
    ],
)
def test_the_objects_check_their_fields(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_the_search_reads_the_same_given_as_objects_or_as_keywords():
    settings = {"start": 8, "limit": 16, "steps": 1, "noise_scale": False, "confirm": False}
    old = tuning.find_batch_size(build, (X, Y), loss=SCE, min_steps_per_epoch=1, **settings)
    job = tuning.TuningJob(build, (X, Y), loss=SCE)
    new = tuning.find_batch_size(job, search=tuning.BatchSearch(min_steps_per_epoch=1, **settings))
    assert [(r.batch_size, r.reason) for r in new.rows] == [
        (r.batch_size, r.reason) for r in old.rows
    ]
    assert (new.mode, new.knee, new.capped_by) == (old.mode, old.knee, old.capped_by)


def test_largest_asks_memory_alone_of_the_job(monkeypatch):
    seen = {}

    def search(job, *, search):
        seen.update(job=job, search=search)
        raise RuntimeError("stop")

    monkeypatch.setattr(largest, "find_batch_size", search)
    job = tuning.TuningJob(build, (X, Y), loss=SCE, job_examples=10**6, budget_s=30.0)
    with pytest.raises(RuntimeError, match="stop"):
        tuning.largest_batch_size(job, start=16)
    assert seen["job"].job_examples is None and seen["job"].budget_s == 30.0
    expected = tuning.BatchSearch(
        start=16, steps=1, noise_scale=False, min_steps_per_epoch=1, confirm=False
    )
    assert seen["search"] == expected


def test_tune_trains_with_adam_unless_the_job_names_an_optimizer(monkeypatch):
    seen = []

    def batch_step(job, examples, users, search):
        seen.append((job.optimizer, users["optimizer"], job.job_examples))
        raise RuntimeError("stop")

    monkeypatch.setattr(joint, "_batch_step", batch_step)
    with pytest.raises(RuntimeError, match="stop"):  # a job without an optimizer: adam
        tuning.tune(tuning.TuningJob(build, (X, Y), SCE), batch_size=8, learning_rate=0.1, epochs=3)
    with pytest.raises(RuntimeError, match="stop"):  # the old call: its fields as keywords
        tuning.tune(
            build,
            (X, Y),
            loss=SCE,
            optimizer="sgd",
            job_examples=99,
            batch_size=8,
            learning_rate=0.1,
        )
    assert seen == [("adam", "adam", 3 * 256), ("sgd", "sgd", 99)]
