"""What the batch tuner can read early, on the CIFAR-shaped CNN job (issue 41, Must 3).

On that job (`batch_size_jobs.py`) `find_batch_size` keeps batch 32 — its time-to-accuracy
step, fed a noise scale B_simple read after a short warm-up, predicts the knee (128) to be
slower — while the knee reaches batch 32's final accuracy sooner. This script reads the
two signals a tuner could afford, at points along one training run at the knee batch
(Adam at the job's rate, as the tuner's warm-up trains):

- B_simple (`tuning.gradient_noise_scale`, batches of 8 and 128) after each of
  `EXAMPLES` examples: does it grow as training goes on?
- an equal-time race from the weights at each point: the model trained on at 32, 64 and
  128 (Adam, the rate scaled by the square root of the batch, as `tuning.recommend`
  does) for `SECONDS` of training each at its own examples/s (measured here), then its
  loss on a fixed slice of the training data. Which batch is ahead, and from when?

Writes `benchmarks/results/batch_size_signals.json`. Run: `python
benchmarks/batch_size_signals.py [--quick]` (`--quick`: small data, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import keras
import tensorflow as tf

from tfaccel import strict_json
from tfaccel.tuning.batch.noise import gradient_noise_scale

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import batch_size_jobs  # noqa: E402  (the CIFAR-shaped data and CNN)

RESULTS = pathlib.Path(__file__).parent / "results"
SCE = "sparse_categorical_crossentropy"
KNEE, RATE = 128, 1e-3  # the job's throughput knee on this host, its Adam rate
BATCHES = (32, 64, 128)
EXAMPLES = (0, 12_800, 51_200, 153_600)  # examples trained at the knee before each reading
SECONDS = (1.5, 3.0, 6.0)  # each batch's share of the race


def adam(batch: int) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(RATE * (batch / 32) ** 0.5)


def examples_per_second(model_weights, data, batch: int) -> float:
    """Training examples/s at `batch`: 30 steps after a traced first step."""
    model = fresh(model_weights, batch)
    batches = iter(data.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    model.train_on_batch(*next(batches))
    began = time.perf_counter()
    for _ in range(30):
        loss = model.train_on_batch(*next(batches))
    float(loss)
    return 30 * batch / (time.perf_counter() - began)


def fresh(weights, batch: int) -> keras.Model:
    """The CNN with `weights`, compiled with a new Adam at `batch`'s rate."""
    model = batch_size_jobs.small_cnn()
    model.compile(adam(batch), SCE)
    model.set_weights(weights)
    return model


def race(weights, data, rates: dict, held) -> dict:
    """Loss on `held` after each of `SECONDS` of training at each batch, from `weights`."""
    results = {}
    for batch in BATCHES:
        keras.utils.set_random_seed(1)
        model = fresh(weights, batch)
        stream = data.shuffle(10_000, seed=1).repeat().batch(batch, drop_remainder=True)
        done, losses = 0, []
        for seconds in SECONDS:
            steps = max(1, round(seconds * rates[batch] / batch)) - done
            if steps > 0:
                model.fit(stream.skip(done), epochs=1, steps_per_epoch=steps, verbose=0)
                done += steps
            losses.append(float(model.evaluate(*held, batch_size=512, verbose=0)))
        results[batch] = losses
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    n = 2_000 if args.quick else 50_000
    points = EXAMPLES[:2] if args.quick else EXAMPLES
    x, y = batch_size_jobs.cifar_like(n, seed=0)
    held = (x[:2048], y[:2048])
    data = tf.data.Dataset.from_tensor_slices((x, y))
    keras.utils.set_random_seed(0)
    model = batch_size_jobs.small_cnn()
    model.compile(keras.optimizers.Adam(RATE), SCE)
    warm = data.shuffle(10_000, seed=0).repeat().batch(KNEE, drop_remainder=True)
    rates = {b: examples_per_second(model.get_weights(), data, b) for b in BATCHES}
    print("examples/s", {b: round(r) for b, r in rates.items()}, flush=True)
    readings, seen = [], 0
    for target in points:
        steps = (target - seen) // KNEE
        if steps:
            model.fit(warm.skip(seen // KNEE), epochs=1, steps_per_epoch=steps, verbose=0)
            seen += steps * KNEE
        noise = gradient_noise_scale(model, data, SCE, small=8, big=KNEE, tolerance=0.1, seed=seen)
        reading = {
            "examples": seen,
            "loss": float(model.evaluate(*held, batch_size=512, verbose=0)),
            "b_simple": noise.b_simple,
            "relative_error": noise.relative_error,
            "race_loss": race(model.get_weights(), data, rates, held),
        }
        ahead = [min(BATCHES, key=lambda b: reading["race_loss"][b][i]) for i in range(3)]
        reading["ahead"] = dict(zip(SECONDS, ahead, strict=True))
        print(strict_json.dumps(reading), flush=True)
        readings.append(reading)
    results = {
        "ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
        "job": "CIFAR-shaped CNN (batch_size_jobs.cifar_job), Adam 1e-3, warm-up at 128",
        "examples_per_second": rates,
        "seconds": SECONDS,
        "readings": readings,
    }
    stem = "batch_size_signals.quick" if args.quick else "batch_size_signals"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(strict_json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
