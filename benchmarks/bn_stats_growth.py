"""Why "fast" never reached the held-out FCN's target on one seed: BatchNorm's moving
statistics against a growing batch.

The held-out Timeseries FCN (`heldout_jobs.fcn_forda_shaped`: three Conv1D + BatchNorm,
840 training series) under `methods.for_fit("fast")`, seed 0: `ProgressiveBatch` grows
the batch 32 -> 256, so an epoch's optimizer steps fall 27 -> 4, and BatchNorm's moving
averages (momentum 0.99 a step) get 8x fewer updates an epoch while the rate is high.
Since `ProgressiveBatch` trains BatchNorm at momentum `m ** growth`
(`methods.batch_growth.BatchNormFollowsBatch`), the run is trained twice, with that
default and with the user's momentum kept (`--seeds` seeds each); each run records the
held-out accuracy per epoch, the training accuracy, and at the end the held-out accuracy
in inference mode (moving statistics) and with the batch's own statistics (training mode,
512 rows).

Run: `python benchmarks/bn_stats_growth.py [--seeds 3] [--epochs 11]`; writes
`benchmarks/results/bn_stats_growth.json`.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import heldout_jobs
import keras
import numpy as np

from tfaccel import methods

OUT = pathlib.Path(__file__).parent / "results" / "bn_stats_growth.json"


def run(seed: int, epochs: int, follow: bool) -> dict:
    """One "fast" run of the FCN through `for_fit`; `follow`: BatchNorm's momentum as
    the method sets it (else the model's own 0.99 kept)."""
    job = heldout_jobs.JOBS["fcn_forda_shaped"]
    parts = job.data()
    keras.utils.set_random_seed(seed)
    model = job.build()
    train, val, optimizer, _ = heldout_jobs.Recipe(batch=32, epochs=0).inputs(parts, seed)
    plan = methods.for_fit("fast", model, train, epochs=epochs, loss=job.loss,
                           optimizer=optimizer, seed=seed)  # fmt: skip
    grown = [m for m in plan.methods if isinstance(m, methods.ProgressiveBatch)]
    if grown and grown[0].statistics is not None and not follow:
        grown[0].statistics.growth = 1
        grown[0].statistics.follow()
    momentum = float(methods.batch_growth.batch_norm_layers(model)[0].momentum)
    model.compile(optimizer=plan.optimizer, loss=plan.loss, metrics=["accuracy"])
    history = model.fit(plan.dataset, epochs=epochs, validation_data=plan.evaluation_data(val),
                        callbacks=plan.callbacks, verbose=0).history  # fmt: skip
    x, y = parts[1][:512], parts[3][:512]
    y = y if y.ndim == 1 else y.argmax(-1)
    modes = {m: float(np.mean(model(x, training=m).numpy().argmax(-1) == y)) for m in (0, 1)}
    return {
        "seed": seed,
        "follows_growth": follow,
        "momentum": momentum,
        "methods": [m.name for m in plan.methods],
        "batch_size": [int(b) for b in history["batch_size"]],
        "accuracy": [round(float(a), 4) for a in history["accuracy"]],
        "val_accuracy": [round(float(a), 4) for a in history["val_accuracy"]],
        "end_val_accuracy_moving_statistics": modes[0],
        "end_val_accuracy_batch_statistics": modes[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=11)
    args = parser.parse_args()
    runs = [run(s, args.epochs, f) for s in range(args.seeds) for f in (False, True)]
    for r in runs:
        print(json.dumps(r))
    OUT.write_text(json.dumps({"seeds": args.seeds, "epochs": args.epochs, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
