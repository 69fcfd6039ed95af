"""A batch that grows after the first pass, against fixed batches, on the CIFAR-shaped CNN job.

`batch_size_signals.py` found the noise scale and an equal-time race favouring batch 32
for about one pass over this job's data and the larger batches after it. This script
checks the remedy that suggests before anyone builds it: the job (`batch_size_jobs.py`'s
CNN, 50,000 examples × 10 epochs, Adam) trained in one process, from one seed, three ways —

- `fixed_32`: batch 32 at the job's rate (the default run);
- `fixed_128`: the throughput knee, 128, at the rate scaled by the square root (2×);
- `grown`: batch 32 for the first epoch, then 128 at the scaled rate (Adam's state kept);

and times each to `fixed_32`'s final held-out accuracy (held-out accuracy 4× an epoch,
the clock paused). Writes `benchmarks/results/batch_size_growing.json`.
Run: `python benchmarks/batch_size_growing.py [--quick]` (`--quick`: its figures mean nothing).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tfaccel import strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import batch_size_jobs  # noqa: E402  (the CIFAR-shaped job)

RESULTS = pathlib.Path(__file__).parent / "results"
EVALS_PER_EPOCH = 4


class Curve(keras.callbacks.Callback):
    """Held-out accuracy 4× an epoch against training seconds, continued across `fit` calls."""

    def __init__(self, held_out):
        super().__init__()
        self.x, self.y = held_out
        self.points: list[tuple[float, float]] = []
        self.seconds = 0.0  # training seconds before the current fit
        self.every = 1

    def on_train_begin(self, logs=None):
        self.began, self.step = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if not self.step % self.every:
            self.read(logs)

    def read(self, logs) -> None:
        """Held-out accuracy now, the training clock paused while it is read."""
        float(logs["loss"])  # host sync: the step has finished
        now = time.perf_counter()
        self.seconds += now - self.began
        guess = self.model.predict(self.x, batch_size=1000, verbose=0)
        self.points.append((self.seconds, float(np.mean(np.argmax(guess, -1) == self.y))))
        self.began = time.perf_counter()  # the evaluation is not training time


def train(job: dict, phases: list[tuple[int, int, float]], seed: int = 0) -> dict:
    """Trains the job through `phases` of (epochs, batch, rate); one model, one optimizer.

    `seed` draws the weights and, with the epoch, each phase's data order.
    """
    x, y = job["data"]
    keras.utils.set_random_seed(seed)
    model = job["build"]()
    optimizer = keras.optimizers.Adam(phases[0][2])
    model.compile(optimizer, "sparse_categorical_crossentropy")
    curve, done = Curve(job["held_out"]), 0
    for epochs, batch, rate in phases:
        optimizer.learning_rate.assign(rate)
        data = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(y), seed=1000 * seed + done)  # a phase's order is not the last one's
            .batch(batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        curve.every = max(1, len(y) // batch // EVALS_PER_EPOCH)
        model.fit(
            data,
            initial_epoch=done,
            epochs=done + epochs,
            callbacks=[curve],
            shuffle=False,
            verbose=0,
        )
        done += epochs
    return {"phases": phases, "curve": curve.points, "final_accuracy": curve.points[-1][1]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    job = batch_size_jobs.cifar_job(args.quick)
    epochs, rate = job["epochs"], job["learning_rate"]
    scaled = rate * (128 / 32) ** 0.5
    runs = {
        "fixed_32": [(epochs, 32, rate)],
        "fixed_128": [(epochs, 128, scaled)],
        "grown": [(1, 32, rate), (epochs - 1, 128, scaled)],
    }
    results = {name: train(job, phases) for name, phases in runs.items()}
    target = results["fixed_32"]["final_accuracy"]
    reached = {
        name: next((t for t, value in run["curve"] if value >= target), None)
        for name, run in results.items()
    }
    for name, run in results.items():
        seconds = reached[name]
        run["time_to_target"] = seconds
        run["ratio"] = None if seconds is None else seconds / reached["fixed_32"]
        print(f"{name}: final {run['final_accuracy']:.4f}, time to {target:.4f}: {run['ratio']}")
    out = {
        "ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
        "target": target,
        "runs": results,
    }
    stem = "batch_size_growing.quick" if args.quick else "batch_size_growing"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(strict_json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
