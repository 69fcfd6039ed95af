"""Checkpoint cost: save seconds for ResNet-50 and the checkpoint's size against its weights.

Builds a Trainer around ResNet-50 (ImageNet stem, 1000 classes, SGD with momentum),
trains one step so that the optimizer's slots exist, then times the Trainer's own
checkpoint writes (`CheckpointState.save`: model, optimizer, counters, metrics' state,
run shape; written, state file rewritten, old checkpoints rotated) after one warm-up
save. Also reports the time `restore` takes (every tensor is read once to verify it,
then restored) and the checkpoint's bytes against the model's weights alone (the
bytes of `model.weights`, as `model.save_weights` would store them) — with momentum
SGD expect about 2× (weights + one slot per trainable variable).

Also times the data fingerprint a checkpoint's run shape records (`tfaccel.data.
fingerprint`): `from_arrays` over 1,000,000 rows (32 float32 features + an int64
label), fingerprinted as the Trainer does it (median of five); it must stay under
0.2 s.

Asynchronous saves (`--async`): a model of >= 100 MB of variables (dense layers,
SGD with momentum: the checkpoint is twice that) trained with `Trainer.fit`, saving
every `--every` steps, run without checkpoints, with synchronous saves
(`Checkpointing(asynchronous=False)`) and with asynchronous ones (the default),
alternating, `--rounds` times. Reports the step loop's stall per save (the time
`CheckpointState.save` holds the loop: the host copy, plus any wait for the previous
write), async / sync (target <= 0.2), and examples/s from `on_train_begin` to
`on_train_end` (every step and save, the last write's wait included; not `fit`'s
setup) with saves / without (target >= 0.95 with async). Writes
`benchmarks/results/checkpoint_async.json` (not with `--quick`).

Run: `python benchmarks/checkpoint.py [--quick]`; writes
`benchmarks/results/checkpoint.json`. `--quick` uses ResNet-18 on 64×64 inputs and
three saves (seconds); the full run (ResNet-50, 224×224, seven saves) takes about a
minute on a CPU, most of it building the model.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json
from tfaccel.data import fingerprint
from tfaccel.train import trainer as trainer_module
from tfaccel.train.state.checkpoint import CheckpointState
from tfaccel.train.state.policies import Checkpointing

RESULTS = pathlib.Path(__file__).parent / "results" / "checkpoint.json"
ASYNC_RESULTS = RESULTS.with_name("checkpoint_async.json")


def build_trainer(depth: int, size: int) -> tfaccel.Trainer:
    def build():
        return tfaccel.models.resnet(depth, input_shape=(size, size, 3), num_classes=1000)

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
    )


def fingerprint_seconds(rows: int = 1_000_000, repeats: int = 5) -> dict:
    """Seconds to fingerprint a `rows`-row in-memory source (hash, then the Trainer's look-up)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 32)).astype("float32")
    y = rng.integers(0, 10, rows)
    hashing, lookup = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fingerprint.digest_arrays((x, y))  # what from_arrays computes once
        hashing.append(time.perf_counter() - start)
    source = tfaccel.data.pipeline(tfaccel.data.from_arrays(x, y), batch_size=256, training=True)
    for _ in range(repeats):
        start = time.perf_counter()
        fingerprint.of_dataset(source)
        lookup.append(time.perf_counter() - start)
    return {
        "fingerprint_rows": rows,
        "fingerprint_seconds": statistics.median(hashing) + statistics.median(lookup),
        "fingerprint_hash_seconds": hashing,
    }


def dense_trainer(width: int, features: int) -> tfaccel.Trainer:
    """Dense layers features -> width -> width -> features -> 10, SGD with momentum."""

    def build():
        keras.utils.set_random_seed(0)
        hidden = [keras.layers.Dense(width, activation="relu") for _ in range(2)]
        layers = [*hidden, keras.layers.Dense(features), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input((features,)), *layers])

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
    )


def timed_fit(trainer, data, steps: int, every: int, mode: str) -> dict:
    """One `fit` of `steps` steps in mode "none", "sync" or "async": seconds and stalls."""
    stalls, save = [], CheckpointState.save

    def timed_save(self, step):
        start = time.perf_counter()
        try:
            return save(self, step)
        finally:
            stalls.append(time.perf_counter() - start)

    class Clock(keras.callbacks.Callback):
        """From the first step to the end of training (the last save's wait included)."""

        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.start

    clock = Clock()
    policy = functools.partial(Checkpointing, asynchronous=mode == "async")
    CheckpointState.save, trainer_module.Checkpointing = timed_save, policy
    try:
        with tempfile.TemporaryDirectory() as directory:
            trainer.fit(
                data,
                epochs=1,
                steps_per_epoch=steps,
                verbose=0,
                checkpoint_dir=None if mode == "none" else directory,
                checkpoint_every=every,
                keep=2,
                callbacks=[clock],
            )
    finally:
        CheckpointState.save, trainer_module.Checkpointing = save, Checkpointing
    return {"seconds": clock.seconds, "stalls": stalls}


def async_benchmark(quick: bool, rounds: int, every: int) -> dict:
    """Stall per save and examples/s: no checkpoints, synchronous, asynchronous saves."""
    width, features, steps, batch = (1024, 512, 20, 32) if quick else (4608, 1024, 60, 64)
    trainer = dense_trainer(width, features)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, features)).astype("float32")
    y = rng.integers(0, 10, batch * 8).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    timed_fit(trainer, data, 2, every, "async")  # warm-up: traced, slots made, one save
    runs = {mode: [] for mode in ("none", "sync", "async")}
    for _ in range(rounds):
        for mode in runs:
            runs[mode].append(timed_fit(trainer, data, steps, every, mode))
    stall = {
        m: statistics.median([s for r in runs[m] for s in r["stalls"]]) for m in ("sync", "async")
    }
    rate = {m: statistics.median(steps * batch / r["seconds"] for r in runs[m]) for m in runs}
    weights = sum(w.nbytes for w in trainer.model.get_weights())
    return {
        "device": tfaccel.devices.describe()["logical_devices"][0]["name"],
        "model": f"dense {features}-{width}-{width}-{features}-10, SGD momentum",
        "variables_mb": weights / 1e6,
        "checkpoint_every": every,
        "steps_per_fit": steps,
        "batch": batch,
        "rounds": rounds,
        "stall_per_save_seconds": stall,
        "stall_async_over_sync": stall["async"] / stall["sync"],
        "examples_per_second": rate,
        "async_with_saves_over_without": rate["async"] / rate["none"],
        "sync_with_saves_over_without": rate["sync"] / rate["none"],
        "fit_seconds": {m: [r["seconds"] for r in runs[m]] for m in runs},
        "quick": quick,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="ResNet-18, 64x64, 3 saves")
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="--async: runs of each mode")
    parser.add_argument("--every", type=int, default=10, help="--async: steps between saves")
    args = parser.parse_args()
    if args.asynchronous:
        results = async_benchmark(args.quick, args.rounds, args.every)
        print(strict_json.dumps(results, indent=2))
        if not args.quick:
            ASYNC_RESULTS.parent.mkdir(exist_ok=True)
            ASYNC_RESULTS.write_text(strict_json.dumps(results, indent=2))
        return
    depth, size, saves = (18, 64, 3) if args.quick else (50, 224, 7)

    trainer = build_trainer(depth, size)
    x = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(2, "int32"))).batch(2)
    with tempfile.TemporaryDirectory() as directory:
        trainer.fit(data, epochs=1, verbose=0, checkpoint_dir=directory)  # slots + ckpt-1
        state = CheckpointState(directory, trainer.strategy, keep=2, **trainer.checkpoint_objects())
        try:
            state.save(2)  # warm-up
            seconds = []
            for step in range(3, 3 + saves):
                start = time.perf_counter()
                state.save(step)
                seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            state.restore()
            restore_seconds = time.perf_counter() - start
        finally:
            state.close()
        files = list(pathlib.Path(directory).glob(f"ckpt-{2 + saves}.*"))
        checkpoint_bytes = sum(p.stat().st_size for p in files)
    weight_bytes = sum(w.nbytes for w in trainer.model.get_weights())
    results = {
        "device": tfaccel.devices.describe()["logical_devices"][0]["name"],
        "model": f"resnet{depth}, {size}x{size}x3, 1000 classes, SGD momentum",
        "parameters": int(trainer.model.count_params()),
        "save_seconds_median": statistics.median(seconds),
        "save_seconds": seconds,
        "restore_seconds": restore_seconds,
        "checkpoint_mb": checkpoint_bytes / 2**20,
        "weights_mb": weight_bytes / 2**20,
        "checkpoint_over_weights": checkpoint_bytes / weight_bytes,
        "quick": args.quick,
        **fingerprint_seconds(),
    }
    print(strict_json.dumps(results, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(strict_json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
