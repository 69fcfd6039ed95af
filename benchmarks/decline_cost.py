"""What `tuning.tune` spends on jobs too small to pay, as a share of the job's training.

For three small jobs (a small CNN on 1,000 CIFAR-shaped examples x 150 epochs, the same
data through an MLP x 50 epochs, recipes/digits.py's job x 150 epochs), in one process:
`tune(..., epochs=E)` from the job's default batch and rate, then the job's training
time estimated as E x one epoch of `model.fit` at the batch tune returned (the median of
3 timed epochs after one warm-up epoch, one `fit` call each), and, without the `fit`
calls' own set-up, E x the median of epochs 2-4 of one `fit(epochs=4)` (the smaller
`job_s_one_fit`: the stricter share). Reports tune's seconds, its share of the job,
what the batch step and the rate step said (a decline names the job size from which the
next probe fits). `tfaccel.tuning` is imported before the clock starts (its import, once
a process, is not the tuner's spending). A shared 2-core CPU: read the shares, not the
seconds.

Run: `python benchmarks/decline_cost.py`; writes `benchmarks/results/decline_cost.json`.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import time

import keras

import tfaccel
from tfaccel import strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import batch_size_jobs as jobs  # noqa: E402  (benchmarks/batch_size_jobs.py: data, models)
import digits  # noqa: E402  (recipes/digits.py)

RESULTS = pathlib.Path(__file__).parent / "results" / "decline_cost.json"
SCE = "sparse_categorical_crossentropy"


def job_list() -> dict:
    x, y = jobs.cifar_like(1_000, seed=0)
    (dx, dy), _, _ = digits.load(0)
    return {  # name: (build, data, batch, rate, epochs)
        "small_cnn_1k_x150": (jobs.small_cnn, (x, y), 32, 1e-3, 150),
        "cifar_mlp_1k_x50": (jobs.cifar_mlp, (x, y), 32, 1e-3, 50),
        "digits_x150": (digits.build_model, (dx, dy), 64, 2e-3, 150),
    }


def epoch_seconds(build, data, batch, rate) -> float:
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(rate), loss=SCE)
    model.fit(*data, batch_size=batch, epochs=1, verbose=0)  # warm-up: tracing
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model.fit(*data, batch_size=batch, epochs=1, verbose=0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class EpochTimes(keras.callbacks.Callback):
    """Each epoch's seconds within one `fit`."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)


def epoch_seconds_one_fit(build, data, batch, rate) -> float:
    """The median of epochs 2-4 of one `fit(epochs=4)`: no `fit` call's own set-up."""
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(rate), loss=SCE)
    times = EpochTimes()
    model.fit(*data, batch_size=batch, epochs=4, verbose=0, callbacks=[times])
    return statistics.median(times.seconds[1:])


def run(name, build, data, batch, rate, epochs) -> dict:
    keras.utils.set_random_seed(0)
    tfaccel.tuning.tune  # noqa: B018 - imports tfaccel.tuning (once a process) before the clock
    start = time.perf_counter()
    tuned = tfaccel.tuning.tune(
        build, data, loss=SCE, batch_size=batch, learning_rate=rate, epochs=epochs, verbose=0
    )
    tune_s = time.perf_counter() - start
    job_s = epochs * epoch_seconds(build, data, tuned.batch_size, tuned.learning_rate)
    one_fit_s = epochs * epoch_seconds_one_fit(build, data, tuned.batch_size, tuned.learning_rate)
    report = tuned.batch_report
    out = {
        "tune_s": tune_s,
        "job_s": job_s,
        "share_of_job": tune_s / job_s,
        "job_s_one_fit": one_fit_s,
        "share_of_one_fit_job": tune_s / one_fit_s,
        "batch": tuned.batch.reason,
        "declined": None if report is None else report.declined,
        "rate": tuned.note or (tuned.rate_report.reason if tuned.rate_report else ""),
        "range_test_ran": tuned.rate_report is not None,
    }
    print(name, json.dumps(out), flush=True)
    return out


def main() -> dict:
    results = {
        "machine": "a shared, loaded 2-core CPU (4 engineers at once): shares only",
        "load_average_1min": os.getloadavg()[0],
        "jobs": {},
    }
    for name, job in job_list().items():
        results["jobs"][name] = run(name, *job)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(strict_json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
