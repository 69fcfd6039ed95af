"""Time to resume on M replicas a run saved on N, against today's iterator restore.

A Trainer fits an MLP on 60,000 in-memory rows (`data.from_arrays`, a `tfaccel.data`
pipeline with a preprocess, a seeded stateless augment, seed, global batch 256: 235
steps an epoch) with a checkpoint every 50 steps, and stops after step `--at` (200 by
default, mid-epoch). A new process then resumes from that checkpoint on M replicas
(logical CPU devices) and runs one step. Timed: from `Trainer.fit` to the end of the
first step after the resume (restore, input set-up and that step), each leg a fresh
process, `--rounds` times (median).

- saved on 1, resumed on 1: the checkpoint holds the tf.data iterator: restored (the
  path before elastic resume, and still the one-device path);
- saved on 2, resumed on 2: no iterator (a distributed one cannot be saved): the input
  is skipped ahead to the saved step;
- saved on 2 → resumed on 1, and 1 → 2: elastic, skipped ahead likewise.

Target (issue 40): elastic resume at most 2× the iterator restore. Also checks the
resumed step's loss is the same on every path (the same batch).

Run: `python benchmarks/elastic.py [--quick]` → `benchmarks/results/elastic.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import keras

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results" / "elastic.json"
ROWS, FEATURES, BATCH = 60_000, 32, 256
PATHS = [(1, 1), (2, 2), (2, 1), (1, 2)]


def leg(args) -> None:
    """One process: train to `--at` and stop (save), or resume and time one step."""
    import numpy as np
    import tensorflow as tf

    import tfaccel
    from tfaccel import data

    tfaccel.devices.configure(virtual_cpus=args.replicas)
    cpus = [f"/cpu:{i}" for i in range(args.replicas)]
    strategy = tfaccel.devices.strategy("mirrored", devices=cpus)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, FEATURES)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")

    def preprocess(x, y):
        return tf.tanh(x * 0.5), y

    def augment(x, y, seed):
        return x + tf.random.stateless_normal([FEATURES], seed, stddev=0.05), y

    train = data.pipeline(
        data.from_arrays(x, y),
        batch_size=BATCH,
        training=True,
        seed=1,
        preprocess=preprocess,
        augment=augment,
        strategy=strategy,
    )
    keras.utils.set_random_seed(0)
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(2, activation="softmax"),
            ]
        ),
        optimizer=lambda: keras.optimizers.SGD(0.05),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
        steps_per_loop=1,
    )
    clock = Clock(args.at if args.save else None)
    start = time.perf_counter()
    trainer.fit(
        train, epochs=1, checkpoint_dir=args.ckpt, checkpoint_every=50, callbacks=[clock], verbose=0
    )
    if not args.save:
        print(json.dumps({"resume_s": clock.first - start, "loss": clock.loss}))


class Clock(keras.callbacks.Callback):
    """Stops after step `stop_at` (saving), or notes the first step's end and stops."""

    def __init__(self, stop_at):
        super().__init__()
        self.stop_at, self.first, self.loss = stop_at, None, None

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self.stop_at is None and self.first is None:
            self.first, self.loss = time.perf_counter(), float(logs["loss"])
            self.model.stop_training = True
        elif self.stop_at is not None and step >= self.stop_at:
            self.model.stop_training = True


def run_leg(ckpt: str, replicas: int, rows: int, at: int, save: bool) -> dict | None:
    command = [sys.executable, __file__, "--leg", "--ckpt", ckpt, "--replicas", str(replicas)]
    command += ["--rows", str(rows), "--at", str(at)] + (["--save"] if save else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return None if save else json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leg", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--at", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leg:
        leg(args)
        return
    rows, at, rounds = (ROWS // 10, 20, 1) if args.quick else (ROWS, args.at, args.rounds)
    times: dict[str, list[float]] = {}
    losses: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        saved = {}
        for n in sorted({n for n, _ in PATHS}):
            saved[n] = os.path.join(tmp, f"saved-on-{n}")
            run_leg(saved[n], n, rows, at, save=True)
        for _ in range(rounds):
            for n, m in PATHS:
                copy = os.path.join(tmp, f"resume-{n}-{m}")
                subprocess.run(["rm", "-rf", copy], check=True)
                subprocess.run(["cp", "-r", saved[n], copy], check=True)
                out = run_leg(copy, m, rows, at, save=False)
                key = f"saved on {n}, resumed on {m}"
                times.setdefault(key, []).append(out["resume_s"])
                losses[key] = out["loss"]
    median = {key: statistics.median(values) for key, values in times.items()}
    restore = median["saved on 1, resumed on 1"]
    result = {
        "rows": rows,
        "resumed_at_step": at,
        "global_batch": BATCH,
        "resume_s": median,
        "ratio_to_iterator_restore": {key: value / restore for key, value in median.items()},
        "first_loss_after_resume": losses,
        "same_batch_on_every_path": max(losses.values()) - min(losses.values()) < 1e-4,
        "rounds": rounds,
        "note": "each leg a fresh process; time from Trainer.fit to the first step's end",
    }
    print(json.dumps(result, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
