"""Time to accuracy on the held-out jobs (`heldout_jobs.py`): "fast" on top of any recipe.

Every held-out job runs four contenders, through `model.fit` (path `fit`, the methods by
`tfaccel.methods.for_fit`) and through `tfaccel.Trainer` (path `trainer`, `methods=`):

- `naive`: the plain script: `compile(Adam())`, batch 32, no callbacks;
- `recipe`: the published example's arguments (its batch, rate and callbacks);
- `fast_naive`: `methods="fast"` given the naive script's arguments;
- `fast_recipe`: `methods="fast"` given the recipe's arguments (its callbacks included).

A job whose recipe is the plain script (Adam, batch 32, no callback) runs `naive` and
`fast_naive` only; its `recipe` rows are those runs. Each run declares `L` times the epochs
the recipe needs to the job's target (`--lengths`, 1, 3 and 10 by default) and stops at the
target (a callback setting `stop_training`; the recipe's own EarlyStopping kept). `naive` and
`recipe` size nothing to the declared epochs, so each runs once per seed, declared 10x, and
its curve cut at `L` times the needed epochs stands for the run declared `L` (the same seed
gives the same path; a run that needs more epochs than declared does not reach the target).
"fast" runs once per declared length. A run is cut at `--cap` seconds (not reached).

Time to target: wall seconds from just before `for_fit` / `Trainer(...)` / `compile`
(start-up, tracing and each epoch's held-out evaluation included) to the end of the first
epoch whose held-out accuracy is at or above the job's fixed target (`heldout_jobs`).
Runs are interleaved by seed; each ratio is paired by seed and given as the median with a
bootstrap 90 % interval over seeds; a run that never reaches the target counts as
infinitely slow, and a run that fails is shown with its error.

Writes `benchmarks/results/time_to_accuracy_heldout.json` (`--merge` keeps its runs and
adds the missing ones). Run: `python benchmarks/time_to_accuracy_heldout.py [--jobs ...]
[--seeds 3] [--lengths 1 3 10] [--paths fit trainer] [--methods fast|auto] [--calibrate]`;
`--methods` is what the "fast" contenders pass (their names stay `fast_*`; each run records it).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import time

import heldout_jobs
import keras
import numpy as np
import tensorflow as tf
from time_to_accuracy import bootstrap, epochs_to, time_to

import tfaccel
from tfaccel import methods

OUT = pathlib.Path(__file__).parent / "results" / "time_to_accuracy_heldout.json"
NAIVE = heldout_jobs.Recipe(batch=32, epochs=0)
FAST = {"methods": "fast"}  # what the fast contenders pass (`--methods`, e.g. "auto")
CONTENDERS = ("naive", "recipe", "fast_naive", "fast_recipe")
BASELINE_LENGTH = 10  # naive and recipe run once, declared this many times the needed epochs
RATIOS = {  # name: (numerator, denominator), both on the same path and length
    "fast_naive/naive": ("fast_naive", "naive"),
    "fast_recipe/recipe": ("fast_recipe", "recipe"),
    "fast_naive/recipe": ("fast_naive", "recipe"),
    "recipe/naive": ("recipe", "naive"),
}


class Curve(keras.callbacks.Callback):
    """Seconds since `start` and held-out accuracy per epoch; stops at the target or the cap."""

    def __init__(self, start: float, target: float, cap: float):
        super().__init__()
        self.start, self.target, self.cap, self.points = start, target, cap, []

    def on_epoch_end(self, epoch, logs=None):
        seconds, accuracy = time.perf_counter() - self.start, float(logs["val_accuracy"])
        self.points.append((seconds, accuracy))
        if accuracy >= self.target - 1e-9 or seconds > self.cap:
            self.model.stop_training = True


def run(job, parts, contender, path, seed, epochs, cap, target=None) -> dict:
    """Trains one contender on one path; its curve and methods, or its error."""
    args = job.recipe if contender.endswith("recipe") else NAIVE
    fast = contender.startswith("fast")
    keras.utils.set_random_seed(seed)
    model = job.build()
    train, val, optimizer, callbacks = args.inputs(parts, seed)
    gc.collect()  # the previous run's garbage, collected outside every run's clock
    start = time.perf_counter()
    curve, applied = Curve(start, job.target if target is None else target, cap), []
    try:
        if path == "fit":
            loss, extra = job.loss, []
            if fast:
                plan = methods.for_fit(
                    FAST["methods"],
                    model,
                    train,
                    epochs=epochs,
                    loss=loss,
                    optimizer=optimizer,
                    seed=seed,
                )
                train, val, optimizer = plan.dataset, plan.evaluation_data(val), plan.optimizer
                loss, extra, applied = plan.loss, plan.callbacks, [m.name for m in plan.methods]
            model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
            model.fit(
                train,
                epochs=epochs,
                validation_data=val,
                callbacks=[*extra, *callbacks, curve],
                verbose=0,
            )
        else:
            trainer = tfaccel.Trainer(
                model,
                optimizer=optimizer,
                loss=job.loss,
                metrics=["accuracy"],
                methods=FAST["methods"] if fast else None,
            )
            trainer.fit(
                train, epochs=epochs, validation_data=val, callbacks=[*callbacks, curve], verbose=0
            )
            plan = getattr(getattr(trainer, "methods", None), "plan", None)
            applied = [m.name for m in plan.methods] if plan else []
    except Exception as error:  # noqa: BLE001 - a contender's failure is a result
        return {"error": f"{type(error).__name__}: {error}"[:400], "curve": curve.points}
    return {"curve": curve.points, "methods": applied}


def planned(job, lengths: list[int]) -> list[tuple[str, int]]:
    """The (contender, declared length) runs a job needs; the recipe's skipped when naive."""
    same = job.recipe.same_as_naive()
    runs = [("naive", BASELINE_LENGTH)] + ([] if same else [("recipe", BASELINE_LENGTH)])
    for length in lengths:
        runs += [("fast_naive", length)] + ([] if same else [("fast_recipe", length)])
    return runs


def key(contender: str, length: int) -> str:
    return f"{contender}@{length}x"


def lookup(job, by_key: dict, contender: str, length: int, seed: int) -> dict | None:
    """A contender's run standing for `length`: the baselines' 10x run cut at `length`."""
    if job.recipe.same_as_naive():
        contender = contender.replace("recipe", "naive")
    if contender in ("naive", "recipe"):
        result = by_key.get(key(contender, BASELINE_LENGTH), {}).get(seed)
        if result is None or "error" in result:
            return result
        return dict(result, curve=result["curve"][: length * job.needed_epochs])
    return by_key.get(key(contender, length), {}).get(seed)


def row(job, by_key, contender, length, seeds) -> dict:
    results = [lookup(job, by_key, contender, length, s) for s in seeds]
    if any(r is None for r in results):
        return {"not_run": True}
    errors = [r["error"] for r in results if "error" in r]
    curves = [r.get("curve", []) for r in results]
    times = [
        math.inf if "error" in r else time_to(c, job.target)
        for r, c in zip(results, curves, strict=True)
    ]
    return {
        "seconds": times,
        "seconds_median": float(np.median(times)),
        "epochs": [epochs_to(c, job.target) for c in curves],
        "reached": sum(math.isfinite(t) for t in times),
        "accuracy_at_stop": [c[-1][1] if c else None for c in curves],
        "methods": results[0].get("methods", []),
        **({"errors": errors} if errors else {}),
    }


def summarize(runs: dict, seeds: list[int], lengths: list[int], paths: list[str]) -> dict:
    """Per job, path and length: each contender's times, and the paired ratios."""
    rng, table = np.random.default_rng(0), {}
    for name, by_path in runs.items():
        job, entry = heldout_jobs.JOBS[name], {}
        for path in paths:
            by_key = by_path.get(path, {})
            for length in lengths:
                rows = {c: row(job, by_key, c, length, seeds) for c in CONTENDERS}
                ratios = {}
                for ratio, (top, bottom) in RATIOS.items():
                    a, b = rows[top], rows[bottom]
                    if "not_run" not in a and "not_run" not in b:
                        per_seed = [
                            _ratio(x, y) for x, y in zip(a["seconds"], b["seconds"], strict=True)
                        ]
                        ratios[ratio] = _interval(per_seed, rng)
                for fast in ("fast_naive", "fast_recipe"):  # the declared length's own cost
                    one = row(job, by_key, fast, 1, seeds)
                    if length != 1 and "not_run" not in one and "not_run" not in rows[fast]:
                        pairs = zip(rows[fast]["seconds"], one["seconds"], strict=True)
                        # only seeds that reached at 1x compare (else the ratio reads 0)
                        per_seed = [x / y if math.isfinite(y) else math.nan for x, y in pairs]
                        ratios[f"{fast}@{length}x/{fast}@1x"] = _interval(per_seed, rng)
                entry[f"{path}@{length}x"] = {"contenders": rows, "ratios": ratios}
        table[name] = entry
    return table


def _ratio(top: float, bottom: float) -> float:
    """Seconds over seconds: 0 where only the bottom never reached, none where both never did."""
    return top / bottom if math.isfinite(top) or math.isfinite(bottom) else math.nan


def _interval(per_seed: list[float], rng) -> dict:
    kept = [r for r in per_seed if not math.isnan(r)]  # neither reached: no ratio
    if not kept:
        return {"ratios": per_seed, "median": math.nan, "low": math.nan, "high": math.nan}
    median, low, high = bootstrap(kept, rng)
    return {"ratios": per_seed, "median": median, "low": low, "high": high}


def show(table: dict, seeds: list[int]) -> str:
    """Markdown: a row per job, path and length; the ratios' medians and intervals."""

    def x(v: float) -> str:
        return "—" if math.isnan(v) else "∞" if not math.isfinite(v) else f"{v:.2f}"

    def span(r: dict) -> str:
        return f"{x(r['median'])} [{x(r['low'])}, {x(r['high'])}]"

    def seconds(row: dict) -> str:
        return "—" if "not_run" in row else x(row["seconds_median"])

    names = [*RATIOS, "fast L× / 1× (naive's; recipe's)", "seconds: naive, fast_naive"]
    lines = ["| job | path | declared | " + " | ".join(names) + " |"]
    lines.append("|" + " --- |" * (3 + len(names)))
    for job, entry in table.items():
        same_as_naive = heldout_jobs.JOBS[job].recipe.same_as_naive()
        for where, cell in entry.items():
            path, length = where.split("@")
            cells, rows = [], cell["contenders"]
            for ratio, (top, _) in RATIOS.items():
                r = cell["ratios"].get(ratio)
                reached = f"({rows[top].get('reached', 0)}/{len(seeds)})"
                if same_as_naive and "recipe" in ratio and ratio != "fast_naive/recipe":
                    cells.append("recipe = naive")
                else:
                    cells.append("not run" if r is None else f"{span(r)} {reached}")
            fasts = ("fast_naive",) if same_as_naive else ("fast_naive", "fast_recipe")
            same = [cell["ratios"].get(f"{f}@{length}/{f}@1x") for f in fasts]
            cells.append("; ".join(span(r) for r in same if r) or "—")
            cells.append(f"{seconds(rows['naive'])}, {seconds(rows['fast_naive'])}")
            lines.append(f"| {job} | {path} | {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibrate(names: list[str], seeds: list[int], max_epochs: int, cap: float) -> dict:
    """The recipe alone, its epochs (capped), no target: the curves that set the targets."""
    found = {}
    for name in names:
        job = heldout_jobs.JOBS[name]
        parts, curves = job.data(), []
        for seed in seeds:
            epochs = min(job.recipe.epochs, max_epochs)
            result = run(job, parts, "recipe", "fit", seed, epochs, cap, target=math.inf)
            curves.append(result)
            best = max((a for _, a in result["curve"]), default=math.nan)
            print(name, seed, f"best {best:.3f}", [round(a, 3) for _, a in result["curve"]])
            print("  ", result.get("error", ""), flush=True)
        found[name] = {"max_epochs": max_epochs, "runs": curves}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", nargs="*", default=list(heldout_jobs.JOBS), choices=list(heldout_jobs.JOBS)
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--lengths", nargs="*", type=int, default=[1, 3, 10])
    parser.add_argument("--paths", nargs="*", default=["fit", "trainer"])
    parser.add_argument("--cap", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--merge", action="store_true", help="keep --out's runs, add missing")
    parser.add_argument("--methods", default="fast", help='what "fast" passes: fast, auto')
    parser.add_argument(
        "--redo", nargs="*", default=[], help="contenders whose kept runs are run again"
    )
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--calibrate-epochs", type=int, default=30)
    parser.add_argument("--summarize", action="store_true", help="only rebuild the table")
    parser.add_argument("--host", default="2 CPU cores shared with other work (a busy host)")
    args = parser.parse_args()
    out, seeds = pathlib.Path(args.out), list(range(args.seeds))
    FAST["methods"] = args.methods
    old = json.loads(out.read_text()) if (args.merge or args.summarize) and out.exists() else {}
    if args.calibrate:
        old["calibration"] = calibrate(args.jobs, seeds, args.calibrate_epochs, args.cap)
        out.write_text(json.dumps(old, indent=1, default=str))
        return
    runs = json.loads(json.dumps(old.get("runs", {})), object_hook=_int_keys)
    for name in args.jobs:  # --redo: one process's code for all of a contender's lengths
        for by_key in runs.get(name, {}).values():
            for gone in [k for k in by_key if k.split("@")[0] in args.redo]:
                del by_key[gone]
    began, code = time.perf_counter(), _code()
    for name in [] if args.summarize else args.jobs:
        job, jobs_runs = heldout_jobs.JOBS[name], runs.setdefault(name, {})
        parts = job.data()
        for seed in seeds:  # interleaved by seed: the machine's drift touches all alike
            for path in args.paths:
                for contender, length in planned(job, args.lengths):
                    slot = jobs_runs.setdefault(path, {}).setdefault(key(contender, length), {})
                    if seed in slot:
                        continue
                    epochs = length * job.needed_epochs
                    slot[seed] = run(job, parts, contender, path, seed, epochs, args.cap)
                    slot[seed]["code"] = code
                    slot[seed]["methods_arg"] = args.methods if "fast" in contender else None
                    curve = slot[seed]["curve"]
                    print(
                        f"{name} {path} seed {seed} {key(contender, length)}: "
                        f"{time_to(curve, job.target):.1f} s, {len(curve)} epochs "
                        f"{slot[seed].get('error', '')[:120]}",
                        flush=True,
                    )
        _write(out, old, runs, args, seeds, time.perf_counter() - began)
    if args.summarize:
        _write(out, old, runs, args, seeds, 0.0)


def _write(out, old, runs, args, seeds, seconds) -> None:
    meta = dict(old.get("meta", {}))
    meta.update(
        seeds=sorted(set(meta.get("seeds", [])) | set(seeds)),
        lengths=sorted(set(meta.get("lengths", [])) | set(args.lengths)),
        paths=sorted(set(meta.get("paths", [])) | set(args.paths)),
        wall_seconds=meta.get("wall_seconds", 0.0) + seconds,
        cap_seconds=args.cap,
        host=args.host,
        load_average_1_5_15_at_the_end=list(os.getloadavg()),
        tensorflow=tf.__version__,
        keras=keras.__version__,
    )
    table = summarize(runs, seeds, meta["lengths"], meta["paths"])
    jobs = {
        name: {
            "source": heldout_jobs.JOBS[name].source,
            "kind": heldout_jobs.JOBS[name].kind,
            "target": heldout_jobs.JOBS[name].target,
            "needed_epochs": heldout_jobs.JOBS[name].needed_epochs,
            "recipe_is_naive": heldout_jobs.JOBS[name].recipe.same_as_naive(),
            **table[name],
        }
        for name in table
    }
    document = {"meta": meta, "jobs": jobs, "runs": runs}
    if "calibration" in old:
        document["calibration"] = old["calibration"]
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(document, indent=1, default=str))
    print(show(table, seeds))


def _code() -> str:
    """The commit the runs used, `+dirty` when tfaccel/ had uncommitted changes."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "+dirty" if git("status", "--short", "tfaccel") else ""
    )


def _int_keys(mapping: dict) -> dict:
    return {int(k) if k.isdigit() else k: v for k, v in mapping.items()}


if __name__ == "__main__":
    main()
