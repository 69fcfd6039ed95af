"""Batch-size search: how good is `find_batch_size`'s choice, what does it cost, does it pay?

Part 1, the throughput knee — ResNet-small on 32×32 inputs (as in `trainer_vs_fit.py`),
all in one process:
1. after a short process warm-up, `tfaccel.tuning.find_batch_size` (binsearch, limit
   1024, noise scale off: this part measures the knee alone) → its knee, timed;
2. an exhaustive sweep over powers of two from 8 to 1024 plus the knee, one model per
   batch, alternating batch sizes round by round after a warm-up, each timed from the
   end of its first step to the end of its last (host sync on the loss).
Reports: quality — examples/s at the knee ÷ the sweep's highest (target ≥ 0.95); cost —
the search's seconds ÷ one 50,000-example epoch at the knee (target ≤ 0.5); speed-up —
examples/s at the knee ÷ at Keras' default batch 32.

Part 2, whole jobs (`batch_size_jobs.py`): digits (the `make run` job, recipes/digits.py's
data and model) and two synthetic CIFAR-shaped jobs (50,000 examples × 10 epochs, a small
CNN and an MLP), each trained at its default batch and at the tuned one (noise scale on, probe
bounded by 10 % of the job, learning rate by the optimizer's rule). Reports the held-out
accuracy of both (target: tuned ≥ default − 0.01), the time to reach the default run's
final accuracy (tuned ÷ default; targets ≤ 1.0 on every job, < 0.8 on two, the MLP's
included), the probe's seconds ÷ the tuned training seconds (target ≤ 0.10), and whether
the job was left at its batch (too small for a probe to pay).

Writes `benchmarks/results/batch_size.json`, `batch_size.png` (part 1's search) and
`batch_size_jobs.png` (part 2: accuracy against training seconds, both runs, per job).
Run: `python benchmarks/batch_size.py [--quick] [--jobs digits cifar cifar_mlp]`. `--quick` checks
that the script works (a small CNN, batches 8–64, few steps, tiny jobs) and writes
`batch_size.quick.*`. `--jobs` runs only part 2's named jobs and merges them into the
existing results JSON (part 1 and the other jobs as they were), redrawing the jobs plot.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import time

import batch_size_jobs  # benchmarks/batch_size_jobs.py
import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json

RESULTS = pathlib.Path(__file__).parent / "results"
JOBS = {
    "digits": batch_size_jobs.digits_job,
    "cifar": batch_size_jobs.cifar_job,
    "cifar_mlp": batch_size_jobs.cifar_mlp_job,
}
EPOCH_EXAMPLES = 50_000


def build_resnet():
    return tfaccel.models.resnet(18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=8)


def build_small_cnn():
    """--quick only: a two-convolution network, so the script runs in about a minute."""
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def make_data(n: int):
    x = np.random.default_rng(0).random((n, 32, 32, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, n).astype("int32")
    return x, y


class _StepTimes(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])  # host sync: the step has finished
        now = time.perf_counter()
        if batch == 0:
            self.start = now
        self.end = now


def contender(build, batch: int, x, y):
    """A model at `batch` and a function timing `steps` of its training steps."""
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    data = (
        tf.data.Dataset.from_tensor_slices((x[:batch], y[:batch]))
        .cache()
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )

    def run(steps: int) -> float:
        timer = _StepTimes()
        model.fit(
            data, epochs=1, steps_per_epoch=steps + 1, callbacks=[timer], shuffle=False, verbose=0
        )
        return batch * steps / (timer.end - timer.start)

    return run


def sweep(build, batches: list[int], x, y, examples: int, rounds: int) -> dict:
    """Median examples/s per batch size, contenders alternating round by round."""
    runs = {b: contender(build, b, x, y) for b in batches}
    steps = {b: max(2, examples // b) for b in batches}
    for run in runs.values():  # warm-up: tracing, first-step costs
        run(1)
    rates = {b: [] for b in batches}
    for index in range(rounds):
        order = batches if index % 2 == 0 else list(reversed(batches))
        for b in order:
            gc.collect()
            rates[b].append(runs[b](steps[b]))
    return {b: statistics.median(r) for b, r in rates.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small CNN, batches 8–64, few steps")
    parser.add_argument(
        "--jobs",
        nargs="+",
        choices=sorted(JOBS),
        help="run only these part-2 jobs; merge them into the existing results JSON",
    )
    parser.add_argument(
        "--no-jobs", action="store_true", help="part 1 only; keep part 2's jobs from the JSON"
    )
    args = parser.parse_args(argv)
    if args.jobs:
        return rerun_jobs(args.jobs, args.quick)
    limit = 64 if args.quick else 1024
    rounds = 2 if args.quick else 5
    examples = 128 if args.quick else 2048
    build = build_small_cnn if args.quick else build_resnet
    x, y = make_data(limit)

    # Process warm-up (thread pools, kernels), as every contender of the sweep gets one.
    contender(build, 32, x, y)(3)
    tfaccel.tuning.release_memory()
    began = time.perf_counter()
    report = tfaccel.tuning.find_batch_size(
        build,
        (x, y),
        loss="sparse_categorical_crossentropy",
        optimizer="sgd",
        start=8,
        limit=limit,
        steps=2 if args.quick else 5,
        noise_scale=False,  # part 1 measures the throughput knee alone,
        min_steps_per_epoch=1,  # on a stand-in for a 50,000-example epoch
    )
    probe_seconds = time.perf_counter() - began
    print(report.table())
    tfaccel.tuning.release_memory()

    powers = [2**k for k in range(3, int(np.log2(limit)) + 1)]
    best = report.best_batch_size
    rates = sweep(build, sorted(set(powers) | {best}), x, y, examples, rounds)
    peak_batch = max(powers, key=rates.get)
    epoch_seconds = EPOCH_EXAMPLES / rates[best]
    results = {
        "device": tfaccel.devices.describe()["logical_devices"][0]["name"],
        "quick": args.quick,
        "model": "small CNN" if args.quick else "ResNet-18, width 8, cifar stem",
        "best_batch_size": best,
        "max_batch_size": report.max_batch_size,
        "sweep_examples_per_s": {str(b): r for b, r in rates.items()},
        "sweep_best_batch_size": peak_batch,
        "quality_best_over_sweep_peak": rates[best] / rates[peak_batch],
        "probe_seconds": probe_seconds,
        "epoch_seconds_at_best": epoch_seconds,
        "cost_probe_over_epoch": probe_seconds / epoch_seconds,
        "speedup_best_over_batch_32": rates[best] / rates[32],
        "report": report.to_dict(),
    }
    results["targets"] = {
        "quality >= 0.95": results["quality_best_over_sweep_peak"] >= 0.95,
        "cost <= 0.5": results["cost_probe_over_epoch"] <= 0.5,
    }
    tfaccel.tuning.release_memory()
    results["jobs"] = {}
    path = RESULTS / f"{_stem(args.quick)}.json"
    if args.no_jobs and path.exists():
        results["jobs"] = json.loads(path.read_text()).get("jobs", {})
    run_jobs(results, [] if args.no_jobs else list(JOBS), args.quick)
    report.plot(RESULTS / f"{_stem(args.quick)}.png")
    return results


def _stem(quick: bool) -> str:
    return "batch_size.quick" if quick else "batch_size"


def run_jobs(results: dict, names: list[str], quick: bool) -> None:
    """Runs part 2's named jobs into `results`; writes the JSON and the jobs plot."""
    jobs = results["jobs"]
    for name in names:
        job = JOBS[name](quick)
        jobs[job["name"]] = batch_size_jobs.run_job(job)
        jobs[job["name"]]["ran_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        tfaccel.tuning.release_memory()
    fast = []  # jobs whose tuned run reached the default's accuracy in < 0.8x its time
    for name, job in jobs.items():
        ratio = job["time_to_default_accuracy_ratio"]
        for key in [k for k in job["targets"] if k.startswith(f"{name}: time to accuracy")]:
            del job["targets"][key]  # an older run's target, replaced by the one below
        job["targets"][f"{name}: time to accuracy <= 1.0"] = ratio is not None and ratio <= 1.0
        if ratio is not None and ratio < 0.8:
            fast.append(name)
    results["targets"]["time to accuracy < 0.8 on two jobs or more, the MLP's included"] = (
        len(fast) >= 2 and "cifar_shaped_mlp" in fast
    )
    results["targets"] = {k: v for k, v in results["targets"].items() if "|" not in k}
    results["targets"].update(
        {f"{name} | {k}": v for name, job in jobs.items() for k, v in job["targets"].items()}
    )
    stem = _stem(quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    batch_size_jobs.plot(
        jobs, RESULTS / f"{stem}.jobs.png" if quick else RESULTS / "batch_size_jobs.png"
    )
    (RESULTS / f"{stem}.json").write_text(strict_json.dumps(results, indent=2))
    summary = {k: v for k, v in results.items() if k not in ("report", "jobs")}
    runs = ("report", "default", "tuned", "knee_alone")
    summary["jobs"] = {
        name: {k: v for k, v in job.items() if k not in runs} for name, job in jobs.items()
    }
    print(strict_json.dumps(summary, indent=2))


def rerun_jobs(names: list[str], quick: bool) -> dict:
    """`--jobs`: reruns the named jobs into the existing results JSON."""
    path = RESULTS / f"{_stem(quick)}.json"
    if not path.exists():
        raise SystemExit(
            f"--jobs merges into {path}, which does not exist: run the whole benchmark first "
            "(without --jobs)."
        )
    results = json.loads(path.read_text())
    results.setdefault("jobs", {})
    run_jobs(results, names, quick)
    return results


if __name__ == "__main__":
    main()
