"""What `callbacks.Bottleneck` costs in `model.fit`: examples/s with and without it.

The worst case for the timed fetch (one eager `next()` per step in place of one in the
graph): an overhead-bound MLP (784-256-10, batch 256, cached and prefetched data) at
`steps_per_execution=1`. Contenders, each its own compiled model, alternating round by
round after a warm-up round, each timed over whole `fit` calls of a fixed number of steps:

- `plain`: no callback;
- `batch_hook`: a callback whose `on_train_batch_end` does nothing (any batch hook turns
  off Keras's asynchronous callback dispatch: the baseline for a per-batch callback);
- `bottleneck`: `callbacks.Bottleneck(verbose=0)`.

Reports medians and the ratios bottleneck ÷ batch_hook and bottleneck ÷ plain. The
machine is shared: treat the figures as noisy.

Run: `python benchmarks/bottleneck_callback.py [--quick]`; writes
`benchmarks/results/bottleneck_callback.json`.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json

RESULTS = pathlib.Path(__file__).parent / "results" / "bottleneck_callback.json"
BATCH = 256


class BatchHook(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    args = p.parse_args(argv)
    rounds, steps = (3, 100) if args.quick else (7, 400)
    x = np.random.default_rng(0).random((8192, 784), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 8192).astype("int32")
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(BATCH, drop_remainder=True)
        .cache()
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    runs = {}
    for name, make in (
        ("plain", lambda: []),
        ("batch_hook", lambda: [BatchHook()]),
        ("bottleneck", lambda: [tfaccel.callbacks.Bottleneck(verbose=0)]),
    ):
        keras.utils.set_random_seed(0)
        model = tfaccel.models.mlp(input_shape=(784,), hidden=(256,), num_classes=10)
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
        runs[name] = lambda s, m=model, make=make: m.fit(
            data, epochs=1, steps_per_epoch=s, verbose=0, callbacks=make()
        )
    for run in runs.values():  # warm-up: traces
        run(20)
    rates = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            run(steps)
            rates[name].append(steps * BATCH / (time.perf_counter() - began))
    median = {name: statistics.median(r) for name, r in rates.items()}
    result = {
        "workload": f"MLP 784-256-10, batch {BATCH}, cached data, steps_per_execution=1",
        "rounds": rounds,
        "steps_per_fit": steps,
        "examples_per_second": rates,
        "median_examples_per_second": median,
        "bottleneck_vs_batch_hook": median["bottleneck"] / median["batch_hook"],
        "bottleneck_vs_plain": median["bottleneck"] / median["plain"],
        "device": "GPU" if tf.config.list_logical_devices("GPU") else "CPU",
    }
    print(strict_json.dumps(result, indent=2))
    if not args.quick:
        RESULTS.write_text(strict_json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
