"""What `tuning.tune` spends on jobs too small to pay, as a share of the job's training.

For three small jobs (a small CNN on 1,000 CIFAR-shaped examples x 150 epochs, the same
data through an MLP x 50 epochs, recipes/digits.py's job x 150 epochs), in one process:
`tune(..., epochs=E)` from the job's default batch and rate, then the job's training
time estimated as E x one epoch of `model.fit` at the batch tune returned (the median of
3 timed epochs after one warm-up epoch). Reports tune's seconds, its share of the job,
what the batch step and the rate step said (a decline names the job size from which the
next probe fits). A shared 2-core CPU: read the shares, not the seconds.

Run: `python benchmarks/decline_cost.py`; writes `benchmarks/results/decline_cost.json`.
"""

from __future__ import annotations

import json
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


def run(name, build, data, batch, rate, epochs) -> dict:
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    tuned = tfaccel.tuning.tune(
        build, data, loss=SCE, batch_size=batch, learning_rate=rate, epochs=epochs, verbose=0
    )
    tune_s = time.perf_counter() - start
    job_s = epochs * epoch_seconds(build, data, tuned.batch_size, tuned.learning_rate)
    report = tuned.batch_report
    out = {
        "tune_s": tune_s,
        "job_s": job_s,
        "share_of_job": tune_s / job_s,
        "batch": tuned.batch.reason,
        "declined": None if report is None else report.declined,
        "rate": tuned.note or (tuned.rate_report.reason if tuned.rate_report else ""),
        "range_test_ran": tuned.rate_report is not None,
    }
    print(name, json.dumps(out), flush=True)
    return out


def main() -> dict:
    results = {"machine": "a shared 2-core CPU (5 engineers at once): shares only", "jobs": {}}
    for name, job in job_list().items():
        results["jobs"][name] = run(name, *job)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(strict_json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
