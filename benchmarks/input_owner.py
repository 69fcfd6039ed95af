"""The input's one owner (issue 38): pipeline builds per `fit`, the time from the `fit` call
to the end of the first step and to `on_train_begin` (checks, builds and the iterator
done; the first step adds the step's tracing and the shuffle buffer's fill), before and
after, in fresh processes, alternating.

Job: two replicas (two logical CPUs), `data.pipeline` over 50,000 examples with a
preprocess map (and a stateless augment), shuffled, global batch 256; a small MLP.
"Before" is another source tree given with `--before` (e.g. a `git worktree` of the
commit before the change); "after" is this one. Each round runs both, in turn, in
fresh processes; the ratio is of the medians.

    python benchmarks/input_owner.py --before /tmp/base --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results" / "input_owner.json"

CHILD = r"""
import os, time, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tfaccel import devices
devices.configure(virtual_cpus=2)
import keras, numpy as np, tensorflow as tf
import tfaccel
from tfaccel import data

builds = {"preprocess": 0, "augment": 0}

def preprocess(x, y):
    builds["preprocess"] += 1
    return tf.math.log1p(tf.abs(x)) * 0.5, y

def augment(x, y, seed):
    builds["augment"] += 1
    return x + tf.random.stateless_normal(tf.shape(x), seed, stddev=0.01), y

rng = np.random.default_rng(0)
x = rng.normal(size=(50_000, 32)).astype("float32")
y = rng.integers(0, 10, 50_000).astype("int32")
strategy = devices.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
train = data.pipeline(data.from_arrays(x, y), batch_size=256, training=True, seed=0,
                      preprocess=preprocess, augment=augment, strategy=strategy)
at_pipeline = dict(builds)
trainer = tfaccel.Trainer(
    lambda: keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)]),
    optimizer=lambda: keras.optimizers.SGD(0.01),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), strategy=strategy)

class FirstStep(keras.callbacks.Callback):
    at = begun = None
    def on_train_begin(self, logs=None):  # the checks, the builds, the iterator: done
        FirstStep.begun = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        if FirstStep.at is None:
            FirstStep.at = time.perf_counter()

began = time.perf_counter()
trainer.fit(train, epochs=1, steps_per_epoch=3, verbose=0, callbacks=[FirstStep()])
print("RESULT", json.dumps({
    "first_step_s": FirstStep.at - began,
    "setup_s": FirstStep.begun - began,
    "builds_in_pipeline": at_pipeline["preprocess"],
    "builds_in_fit": builds["preprocess"] - at_pipeline["preprocess"],
    "augment_traces_in_fit": builds["augment"] - at_pipeline["augment"],
}))
"""


def run(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tree,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="source tree before the change")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    after = str(HERE.parent)
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            runs[name].append(run(args.before if name == "before" else after))
            print(name, runs[name][-1], flush=True)
    first = {k: statistics.median(v["first_step_s"] for v in runs[k]) for k in runs}
    setup = {k: statistics.median(v["setup_s"] for v in runs[k]) for k in runs}
    result = {
        "job": "2 replicas, data.pipeline over 50,000 examples (preprocess + stateless "
        "augment, shuffled), global batch 256, MLP 32-64-10",
        "rounds": args.rounds,
        "fresh_processes": True,
        "first_step_s_median": first,
        "first_step_ratio_after_over_before": first["after"] / first["before"],
        "setup_s_median": setup,
        "setup_ratio_after_over_before": setup["after"] / setup["before"],
        "builds_in_fit": {k: runs[k][0]["builds_in_fit"] for k in runs},
        "builds_in_pipeline_call": {k: runs[k][0]["builds_in_pipeline"] for k in runs},
        "augment_traces_in_fit": {k: runs[k][0]["augment_traces_in_fit"] for k in runs},
        "runs": runs,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
