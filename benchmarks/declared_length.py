"""Time to target with the epochs declared 1x, 3x and 10x what the job needs.

A user declares generous epochs and stops early (keras.io's `epochs=150` + `EarlyStopping`);
`"fast"`'s one-cycle is sized to the declared epochs, so a generous declaration stretches
its path. This runs *choice* jobs of `time_to_accuracy.py` (`digits_cnn`,
`digits_sequence`, `cifar_shaped_cnn`, and the table `generated_table_mlp`: 28,000 rows of
scikit-learn's `make_classification`; the jobs "fast" was chosen on) with the epochs the plain
script needs
(the job's own epochs, 1x), 3x and 10x, stopped at the job's target (its
`time_to_accuracy.json` target; a run not there after 3x the needed epochs counts as never),
for two contenders through `for_fit` + `model.fit`:

- `fast`: `methods="fast"`'s stack with its schedule a `OneCycle(scale=s)` sized to the
  declared epochs (as "fast" was before `Plateau` replaced it);
- `fast_plateau`: the same stack with `methods.adaptive.Plateau(scale=s)` in its place (a
  warm-up over the first epoch, then the rate halved when the validation loss stalls an
  epoch: no end date).
The stack's other methods are length-free (the batch stages by epochs counted from the start,
the length rule by one epoch's steps) since 2026-12-07; the rows of earlier runs had the
stages at a share of the declared epochs (the same at 1x).

Per seed, each run's time to target is divided by `fast`'s at 1x of the same seed (runs
interleaved by seed); the table gives the median ratio and its bootstrap 90 % interval, and
the epochs to target; the *path* ratio divides the seconds after the first epoch (a
run at its target after one epoch has a path of 0 s, and a ratio of 0 or nan).
Writes `benchmarks/results/declared_length.json`.
Run: `python benchmarks/declared_length.py [--seeds 3] [--jobs digits_cnn digits_sequence]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time

import keras
import numpy as np
import tensorflow as tf
import time_to_accuracy as tta

from tfaccel import methods
from tfaccel.methods.adaptive import Plateau
from tfaccel.methods.composition import FAST, other_schedule

LENGTHS = (1, 3, 10)
CAP = 3  # a run not at its target after CAP x the needed epochs counts as never there
OUT = tta.RESULTS / "declared_length.json"


class Cap(keras.callbacks.Callback):
    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.epochs:
            self.model.stop_training = True


def stack(contender: str, job: methods.Job, kind: str) -> list[methods.Method]:
    """ "fast"'s stack for `job` with its schedule a one-cycle (`fast`) or `Plateau`."""
    chosen = FAST[kind](job)
    plateau = any(isinstance(m, Plateau) for m in chosen)
    if plateau == (contender == "fast_plateau"):
        return chosen
    return other_schedule(chosen)[1]


def run(job: dict, parts, contender: str, seed: int, declared: int, target: float) -> dict:
    """One `model.fit` declared `declared` epochs, stopped at `target`: its curve."""
    xt, xv, yt, yv = parts
    keras.utils.set_random_seed(seed)
    model = job["build"]()
    train = tf.data.Dataset.from_tensor_slices((xt, yt)).shuffle(len(xt), seed=seed)
    train = train.batch(tta.BATCH)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    loss, optimizer = "sparse_categorical_crossentropy", keras.optimizers.Adam()
    sized = methods.Job(model, loss, optimizer, train.element_spec, declared, len(train), tta.BATCH)
    plan = methods.for_fit(
        stack(contender, sized, job["kind"]),
        model,
        train,
        epochs=declared,
        loss=loss,
        optimizer=optimizer,
        batch_size=tta.BATCH,
        kind=job["kind"],
        seed=seed,
    )
    model.compile(optimizer=plan.optimizer, loss=plan.loss, metrics=["accuracy"])
    gc.collect()
    start = time.perf_counter()
    curve = tta.Curve(start, target)
    capped = Cap(CAP * job["epochs"])
    model.fit(
        plan.dataset,
        epochs=declared,
        validation_data=plan.evaluation_data(val),
        callbacks=[*plan.callbacks, curve, capped],
        verbose=0,
    )
    return {"curve": curve.points, "methods": [m.name for m in plan.methods]}


def _path(curve, target: float) -> float:
    """Seconds from the first epoch's end to the target: the path, free of the start-up
    (traces, the first epoch) that the busy host's load swamps."""
    return tta.time_to(curve, target) - curve[0][0]


def summarize(runs: dict, seeds: list[int], targets: dict) -> dict:
    """Per job, contender and length: time and epochs to target, ratio to fast at 1x."""
    rng = np.random.default_rng(0)
    table: dict = {}
    for name, by_key in runs.items():
        target, seeds = targets[name], sorted(set(seeds) & set(by_key["fast@1x"]))
        base = {s: tta.time_to(by_key["fast@1x"][s]["curve"], target) for s in seeds}
        base_path = {s: _path(by_key["fast@1x"][s]["curve"], target) for s in seeds}
        base_epochs = {s: tta.epochs_to(by_key["fast@1x"][s]["curve"], target) for s in seeds}
        rows = {}
        for key, by_seed in by_key.items():
            times = [tta.time_to(by_seed[s]["curve"], target) for s in seeds]
            ratios = [t / base[s] for t, s in zip(times, seeds, strict=True)]
            median, low, high = tta.bootstrap(ratios, rng)
            paths = [_path(by_seed[s]["curve"], target) for s in seeds]
            path_ratios = [p / base_path[s] for p, s in zip(paths, seeds, strict=True)]
            path_median, path_low, path_high = tta.bootstrap(path_ratios, rng)
            rows[key] = {
                "path_ratio_median": path_median,
                "path_ratio_low": path_low,
                "path_ratio_high": path_high,
                "path_seconds": paths,
                "ratio_to_fast_1x_median": median,
                "ratio_low": low,
                "ratio_high": high,
                "ratios": ratios,
                "seconds": times,
                "epochs": [tta.epochs_to(by_seed[s]["curve"], target) for s in seeds],
                "epochs_ratio_median": float(
                    np.median(
                        [tta.epochs_to(by_seed[s]["curve"], target) / base_epochs[s] for s in seeds]
                    )
                ),
                "reached": sum(math.isfinite(t) for t in times),
                "methods": by_seed[seeds[0]]["methods"],
            }
        needed = tta.JOBS[name]["epochs"]
        table[name] = {"target": target, "needed_epochs": needed, "seeds": seeds, "rows": rows}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", nargs="*", default=["digits_cnn", "digits_sequence"])
    parser.add_argument("--summarize", action="store_true", help="only rebuild the table")
    parser.add_argument("--merge", action="store_true", help="add these jobs to the file's")
    args = parser.parse_args()
    if args.summarize:
        old = json.loads(OUT.read_text())
        table = summarize(
            _int_keys(old["runs"]),
            list(range(99)),  # each job its own seeds
            {n: e["target"] for n, e in old["jobs"].items()},
        )
        OUT.write_text(json.dumps({**old, "jobs": table}, indent=1))
        return show(table)
    seeds = list(range(args.seeds))
    chosen = json.loads((tta.RESULTS / "time_to_accuracy.json").read_text())["jobs"]
    targets = {name: chosen[name]["target"] for name in args.jobs}
    runs: dict = {}
    began = time.perf_counter()
    for name in args.jobs:
        job = dict(tta.JOBS[name], name=name)
        parts = job["data"]()
        for seed in seeds:  # interleaved by seed: the machine's drift touches all alike
            for times in LENGTHS:
                for contender in ("fast", "fast_plateau"):
                    declared = times * job["epochs"]
                    result = run(job, parts, contender, seed, declared, targets[name])
                    runs.setdefault(name, {}).setdefault(f"{contender}@{times}x", {})[seed] = result
                    print(
                        f"{name} seed {seed} {contender}@{times}x: {result['curve'][-1]}",
                        flush=True,
                    )
    old = json.loads(OUT.read_text()) if args.merge else {"runs": {}, "meta": {}}
    runs = {**_int_keys(old["runs"]), **runs}
    targets = {**{n: e["target"] for n, e in old.get("jobs", {}).items()}, **targets}
    table = summarize(runs, list(range(99)), targets)
    meta = {
        "seeds": 'per job: jobs[name]["seeds"]',
        "lengths": LENGTHS,
        "cap_epochs": f"{CAP}x the needed epochs",
        "wall_seconds": time.perf_counter() - began + old["meta"].get("wall_seconds", 0),
        "host": "2 CPU cores shared with other jobs running at the same time (busy)",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    OUT.write_text(json.dumps({"meta": meta, "jobs": table, "runs": runs}, indent=1))
    show(table)


def _int_keys(runs: dict) -> dict:
    return {
        j: {k: {int(s): r for s, r in v.items()} for k, v in e.items()} for j, e in runs.items()
    }


def show(table: dict) -> None:
    for name, entry in table.items():
        print(name, "target", entry["target"])
        for key, row in entry["rows"].items():
            print(
                f"  {key:<18} {row['ratio_to_fast_1x_median']:.2f} "
                f"[{row['ratio_low']:.2f}, {row['ratio_high']:.2f}] path "
                f"{row['path_ratio_median']:.2f} [{row['path_ratio_low']:.2f}, "
                f"{row['path_ratio_high']:.2f}] epochs {row['epochs_ratio_median']:.2f} "
                f"{row['epochs']}"
            )


if __name__ == "__main__":
    main()
