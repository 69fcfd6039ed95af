"""Start-up: time from the `fit` call to the end of the first step, and to the end of `fit`.

`model.fit` against `Trainer.fit` on six small jobs (a digits MLP with
`validation_split`, a CNN, a ResNet, a `from_generator` pipeline, a CSV file pipeline, a
compiled model adopted), on 1 and 2 replicas (two logical CPUs, as the tests make them).
Each measurement is a fresh process (the first `fit` in it, as a new user meets it);
contenders alternate, round by round: `model.fit`, the Trainer of this tree, and with
`--before PATH` the Trainer of another copy of the package (e.g. `git archive` of an older
commit, put first on `PYTHONPATH`). One replica is the default strategy for both, two a
`MirroredStrategy` over the two logical CPUs. The first step ends at the first
`on_train_batch_end` (a callback that does not cap the Trainer's loop size). Reports
medians, ratios (÷ model.fit: lower is better) and, for the Trainer, the median of each
start-up phase (`trainer.startup`, where the code under test has it).

Run: `python benchmarks/startup.py [--rounds N] [--before PATH] [--after PATH] [--jobs a,b]
[--jobs2 c,d] [--out FILE]`; writes `benchmarks/results/startup.json`. Issue 56's runs:
`--before` = `git archive 4a80afa tfaccel` (the tree before the issue), `--after` = a
`git archive` of the fixed tree (so that edits meanwhile do not leak in); and for the
per-phase table (`results/startup_phases.json`, `--jobs mlp,cnn --jobs2 ""`) the before
tree with only the report added (`setup/startup.py`, `step/traces.py`, the Trainer's laps).
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

RESULTS = pathlib.Path(__file__).parent / "results" / "startup.json"
JOBS = ("mlp", "cnn", "resnet", "generator", "csv", "compiled")
EPOCHS = 3


def _data(job: str, rng):
    """Features, integer labels and the model builder of `job` (arrays or a dataset maker)."""
    import keras
    import numpy as np

    import tfaccel

    if job in ("mlp", "compiled"):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x, y = (x / 16.0).astype("float32"), y.astype("int32")
        return x, y, lambda: tfaccel.models.mlp(input_shape=(64,), hidden=(64,), num_classes=10)
    if job == "cnn":
        x = rng.random((512, 28, 28, 1), dtype=np.float32)

        def build():
            inputs = keras.Input((28, 28, 1))
            h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
            h = keras.layers.MaxPooling2D()(h)
            h = keras.layers.Conv2D(32, 3, activation="relu")(h)
            h = keras.layers.GlobalAveragePooling2D()(h)
            return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))

        return x, rng.integers(0, 10, 512).astype("int32"), build
    if job == "resnet":
        x = rng.random((256, 32, 32, 3), dtype=np.float32)
        return (
            x,
            rng.integers(0, 10, 256).astype("int32"),
            lambda: tfaccel.models.resnet(
                18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=8
            ),
        )
    x = rng.random((1024, 32), dtype=np.float32)
    y = rng.integers(0, 10, 1024).astype("int32")
    return x, y, lambda: tfaccel.models.mlp(input_shape=(32,), hidden=(64,), num_classes=10)


def _csv_model(columns):
    import keras

    inputs = {c: keras.Input((), name=c) for c in columns}
    h = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[c]) for c in columns])
    h = keras.layers.Dense(64, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))


def _write_csv(x, y) -> tuple[str, list[str]]:
    columns = [f"f{i}" for i in range(8)]
    path = os.path.join(tempfile.mkdtemp(), "table.csv")
    with open(path, "w") as handle:
        handle.write(",".join(columns + ["label"]) + "\n")
        for row, label in zip(x[:, :8], y, strict=True):
            handle.write(",".join(f"{v:.5f}" for v in row) + f",{label}\n")
    return path, columns


def one(job: str, contender: str, replicas: int) -> dict:
    """One measurement in this (fresh) process; returns its numbers."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    import tfaccel

    tfaccel.devices.configure(virtual_cpus=2)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x, y, build = _data(job, np.random.default_rng(0))
    strategy = tf.distribute.get_strategy()
    if replicas > 1:
        strategy = tfaccel.devices.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    marks = {}

    class FirstStep(keras.callbacks.Callback):
        loop_batches_ok = True  # does not cap the Trainer's steps per loop

        def on_train_batch_end(self, batch, logs=None):
            marks.setdefault("first_step", time.perf_counter())

    fit_args = {"epochs": EPOCHS, "verbose": 0, "callbacks": [FirstStep()]}
    data_args = {"x": x, "y": y, "batch_size": 32}
    if job == "mlp" or job == "compiled":
        data_args["validation_split"] = 0.1
    if job == "generator":

        def shard(index, count):
            for i in range(int(index), 1024, int(count)):
                yield x[i], y[i]

        signature = (tf.TensorSpec((32,), tf.float32), tf.TensorSpec((), tf.int32))
    if job == "csv":
        path, columns = _write_csv(x, y)
        build = lambda: _csv_model(columns)  # noqa: E731
    began = time.perf_counter()
    with strategy.scope():
        model = build()
    if contender == "keras" or job == "compiled":
        with strategy.scope():
            model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    if contender == "keras":
        if job == "generator":
            data = tf.data.Dataset.from_generator(
                lambda: shard(0, 1), output_signature=signature
            ).shuffle(1024)
            data_args = {"x": data.batch(32).prefetch(tf.data.AUTOTUNE)}
        elif job == "csv":
            data = tf.data.experimental.make_csv_dataset(
                path, batch_size=32, label_name="label", num_epochs=1, shuffle=True
            )
            data_args = {"x": data.prefetch(tf.data.AUTOTUNE)}
        runner, fit = model, model.fit
    else:
        if job == "compiled":
            trainer = tfaccel.Trainer(model, strategy=strategy)
        else:
            trainer = tfaccel.Trainer(
                model,
                optimizer="adam",
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
                strategy=strategy,
            )
        if job == "generator":
            source = tfaccel.data.from_generator(shard, signature, shards=4, count=1024)
            data_args = {"x": tfaccel.data.pipeline(source, batch_size=32, training=True)}
        elif job == "csv":
            source = tfaccel.data.from_csv(path, label="label")
            data_args = {"x": tfaccel.data.pipeline(source, batch_size=32, training=True)}
        runner, fit = trainer, trainer.fit
    built = time.perf_counter()
    history = fit(**data_args, **fit_args)
    ended = time.perf_counter()
    result = {
        "setup_s": built - began,
        "first_step_s": marks["first_step"] - built,
        "fit_s": ended - built,
        "final_loss": float(history.history["loss"][-1]),
    }
    startup = getattr(runner, "startup", None)
    if startup is not None:
        result["phases"] = dict(startup.phases)
        result["traces"] = dict(getattr(startup, "traces", {}))
    return result


def _spawn(job: str, contender: str, replicas: int, trees: dict) -> dict:
    env = dict(os.environ)
    tree = trees.get(contender)  # a copy of the package to import instead of this one
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    which = "trainer" if contender == "trainer_before" else contender
    command = [sys.executable, __file__, "--one", job, which, str(replicas)]
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"{job}/{contender}/{replicas} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _median_phases(runs: list[dict]) -> dict:
    names = list(dict.fromkeys(name for run in runs for name in run.get("phases", {})))
    return {n: statistics.median(r.get("phases", {}).get(n, 0.0) for r in runs) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", nargs=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None)
    parser.add_argument("--after", default=None, help="a copy of this tree (edits meanwhile)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--jobs2", default="mlp,cnn,generator,compiled", help="on 2 replicas")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]))))
        return
    cases = [(j, 1) for j in args.jobs.split(",")] + [(j, 2) for j in args.jobs2.split(",") if j]
    contenders = ["keras", "trainer"] + (["trainer_before"] if args.before else [])
    runs: dict = {f"{j}/{r}": {c: [] for c in contenders} for j, r in cases}
    began = time.perf_counter()
    for index in range(args.rounds):
        for job, replicas in cases:
            shift = index % len(contenders)  # each contender leads in turn
            for contender in contenders[shift:] + contenders[:shift]:
                trees = {"trainer_before": args.before, "trainer": args.after}
                result = _spawn(job, contender, replicas, trees)
                runs[f"{job}/{replicas}"][contender].append(result)
        print(f"round {index + 1}: {time.perf_counter() - began:.0f} s", flush=True)
    table = {case: _row(by) for case, by in runs.items()}
    results = {
        "machine": "shared 2-core CPU, loaded by other sessions: ratios only",
        "rounds": args.rounds,
        "epochs": EPOCHS,
        "before": args.before,
        "ratio": "contender / model.fit (lower is better); after_over_before: Trainer now / then",
        "jobs": table,
        "wall_s": round(time.perf_counter() - began),
    }
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


def _row(by: dict) -> dict:
    row = {}
    for key in ("first_step_s", "fit_s", "setup_s"):
        medians = {c: statistics.median(r[key] for r in runs) for c, runs in by.items()}
        row[key] = {c: round(m, 3) for c, m in medians.items()}
        for contender in (c for c in medians if c != "keras"):
            row[key][f"{contender}_ratio"] = round(medians[contender] / medians["keras"], 2)
        if "trainer_before" in medians:
            ratio = medians["trainer"] / medians["trainer_before"]
            row[key]["after_over_before"] = round(ratio, 2)
    for contender in (c for c in by if c != "keras"):
        phases = _median_phases(by[contender])
        if phases:  # a tree with `trainer.startup`
            row[f"{contender}_phases_s"] = {k: round(v, 3) for k, v in phases.items()}
            row[f"{contender}_traces"] = by[contender][-1].get("traces", {})
    print({k: {c: v for c, v in row[k].items() if "ratio" in c} for k in ("first_step_s", "fit_s")})
    return row


if __name__ == "__main__":
    main()
