"""Image recipes: the tfaccel way vs a Keras-tutorial `model.fit`, examples/s for the same steps.

For each image recipe (MLP and GoogLeNet on Fashion-MNIST, ResNet-18 on CIFAR-10), the
recipe's own model, optimizer and per-example functions train for the same number of
steps two ways, in one process, alternating round by round after a warm-up call each:

- tfaccel: `tfaccel.data.pipeline` (preprocess → cache → augment → shuffle → batch →
  batch_map → prefetch) and the `tfaccel.Trainer`;
- baseline: what a Keras tutorial writes: `map` (preprocess, augment, resize per
  example) → `shuffle` → `batch` on a `tf.data` chain without cache or prefetch, and
  `model.compile(...)` + `model.fit`.

The images are random uint8 arrays of each dataset's shape (speed does not depend on
their content, and no download is needed). The warm-up reads the whole set once, so
tfaccel's cache is filled before timing, as in any run of more than one epoch; each
timed epoch is the second of its `fit` call, so one-off costs (a new iterator filling
its shuffle buffer) stay out, as they would in a long run.
Reports median examples/s and the ratio tfaccel ÷ baseline (target >= 1.5 on a CPU).

Run: `python benchmarks/recipes.py [--quick] [--only NAMES] [--steps N] [--rounds N]`;
writes `benchmarks/results/recipes.json` (with `--only`, the other recipes' figures stay).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import pathlib
import statistics
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import googlenet_fashion_mnist as googlenet  # noqa: E402
import mlp_fashion_mnist as mlp  # noqa: E402
import resnet_cifar10 as resnet  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results" / "recipes.json"
LOSS = "sparse_categorical_crossentropy"


def recipes(quick: bool) -> dict:
    """name → (image shape, build, optimizer fn, preprocess, augment, batch_map, batch)."""
    return {
        "mlp_fashion_mnist": (
            (28, 28, 1), mlp.build_model, mlp.sgd, mlp.flatten, None, None, 16 if quick else 256,
        ),
        "googlenet_fashion_mnist": (
            (28, 28, 1), googlenet.build_model, googlenet.sgd, googlenet.scale, None,
            googlenet.resize, 16 if quick else 128,
        ),
        "resnet_cifar10": (
            (32, 32, 3), lambda: resnet.build_model(8 if quick else 64),
            resnet.optimizer_for(1), resnet.normalize, resnet.pad_crop_flip, None,
            16 if quick else 128,
        ),
    }  # fmt: skip


def images(shape, count: int):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
    return x, rng.integers(0, 10, count).astype("int64")


class EpochTimer(keras.callbacks.Callback):
    """Seconds of each epoch; the logs are host floats by then, so the work is done."""

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)


def tfaccel_contender(x, y, build, optimizer, preprocess, augment, batch_map, batch):
    data = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(x, y),
        batch_size=batch,
        training=True,
        preprocess=preprocess,
        augment=augment,
        batch_map=batch_map,
        repeat=True,
        seed=0,
    )
    keras.utils.set_random_seed(0)
    trainer = tfaccel.Trainer(
        build, optimizer=lambda: optimizer(0.01, 100), loss=LOSS, metrics=["accuracy"]
    )

    def run(steps, epochs):
        timer = EpochTimer()
        trainer.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
        return timer.seconds

    return run


def baseline_contender(x, y, build, optimizer, preprocess, augment, batch_map, batch):
    """The tutorial chain: map → shuffle → batch (no cache, no prefetch), then model.fit."""

    def per_example(image, label):
        image, label = preprocess(image, label)
        if augment is not None:
            image, label = augment(image, label)
        if batch_map is not None:
            image, label = batch_map(image, label)
        return image, label

    data = tf.data.Dataset.from_tensor_slices((x, y)).map(per_example)
    data = data.shuffle(1000, seed=0).batch(batch).repeat()
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=optimizer(0.01, 100), loss=LOSS, metrics=["accuracy"])

    def run(steps, epochs):
        timer = EpochTimer()
        model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
        return timer.seconds

    return run


def measure(runs: dict, warmup_steps: int, steps: int, rounds: int) -> dict:
    """Seconds per epoch of `steps` steps, per contender, alternating round by round.

    Each round is one `fit` call of two epochs per contender; the first epoch (a new
    iterator filling its shuffle buffer) is left out, the second is timed, so what
    is measured is steady-state training, as in a long run.
    """
    for run in runs.values():  # tracing, and one full pass that fills tfaccel's cache
        run(warmup_steps, 1)
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            gc.collect()
            times[name].append(run(steps, 2)[-1])
    return times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small batches, few steps, 1 round")
    parser.add_argument("--only", default=None, help="comma-separated recipe names to run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per epoch (10)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (3)")
    args = parser.parse_args(argv)
    rounds, steps, count = (1, 2, 64) if args.quick else (3, 10, 1024)
    rounds, steps = args.rounds or rounds, args.steps or steps
    tfaccel.devices.configure()
    results = {"device": tfaccel.devices.describe()["logical_devices"][0]["name"]}
    if args.only and not args.quick and RESULTS.exists():  # keep the other recipes' figures
        results = {**json.loads(RESULTS.read_text()), **results}
    for name, (shape, *spec) in recipes(args.quick).items():
        if args.only and name not in args.only.split(","):
            continue
        batch = spec[-1]
        x, y = images(shape, count)
        runs = {
            "tfaccel": tfaccel_contender(x, y, *spec),
            "baseline_fit": baseline_contender(x, y, *spec),
        }
        times = measure(runs, math.ceil(count / batch) + 1, steps, rounds)
        rates = {k: batch * steps / statistics.median(v) for k, v in times.items()}
        paired = [b / t for t, b in zip(times["tfaccel"], times["baseline_fit"], strict=True)]
        results[name] = {
            "batch_size": batch,
            "steps": steps,
            "rounds": rounds,
            "examples_per_s": rates,
            "tfaccel_over_baseline": rates["tfaccel"] / rates["baseline_fit"],
            "paired_tfaccel_over_baseline": statistics.median(paired),
        }
        print(f"{name}: {strict_json.dumps(results[name])}", flush=True)
        keras.backend.clear_session()
    results["targets"] = {
        f"{name}_tfaccel_over_baseline >= 1.5": value["paired_tfaccel_over_baseline"] >= 1.5
        for name, value in results.items()
        if isinstance(value, dict) and "paired_tfaccel_over_baseline" in value
    }
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(strict_json.dumps(results, indent=2))
    print(strict_json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
