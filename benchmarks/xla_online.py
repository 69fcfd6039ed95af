"""XLA chosen online (issue 67, 2): start-up and whole-fit time against the probe before it.

One job long enough for the online A/B (a 12-feature MLP, batch 32, 2 epochs of 100 steps,
5 steps a loop, `jit_compile="auto"`), each run a fresh process, alternating the tree
under test with `--before PATH` (e.g. `git archive 7c0b66e tfaccel | tar -x -C PATH`, the
tree before the change). Reports each run's whole `fit`, its start-up (`trainer.startup`)
and the start-up's "precision and XLA choice" phase, and the XLA row, and the medians.

Run: `python benchmarks/xla_online.py --before PATH [--rounds N]`; writes
`benchmarks/results/xla_online.json`.
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

RESULTS = pathlib.Path(__file__).parent / "results" / "xla_online.json"
JOB = """
import json, time
import numpy as np, keras, tensorflow as tf
import tfaccel
x = np.random.default_rng(0).random((256, 12), dtype=np.float32)
y = (x.sum(axis=1) > 6).astype(np.int32)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
build = lambda: keras.Sequential(
    [keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
t = tfaccel.Trainer(build, optimizer=lambda: keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_loop=5)
began = time.perf_counter()
t.fit(data, epochs=2, steps_per_epoch=100, verbose=0)
wall = time.perf_counter() - began
s = t.startup.to_dict()
print(json.dumps({"fit_s": wall, "startup_s": s["total_s"],
    "choice_s": s["phases_s"].get("precision and XLA choice", 0.0),
    "row": str(t.settings["jit_compile"])}))
"""


def run(path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(  # not from this tree's root: `-c` puts the cwd first
        [sys.executable, "-c", JOB], env=env, capture_output=True, text=True, check=True,
        cwd=tempfile.gettempdir(),
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    here = str(pathlib.Path(__file__).resolve().parent.parent)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, path in (("before", args.before), ("after", here)):
            runs[name].append(run(path))
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("fit_s", "startup_s", "choice_s")}
        for name, rs in runs.items()
    }
    result = {"runs": runs, "medians": medians}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
