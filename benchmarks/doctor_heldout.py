"""The doctor's first fix, applied as a `model.fit` user would, judged by time to accuracy.

Issue 67: on every held-out job (`heldout_jobs.py`: keras.io examples ported as written),
the doctor's first fix must not slow the time to the job's target (ratio ≥ 1.0).

Per job: the published recipe's model, compiled as the job compiles it (`Recipe.inputs`:
its data, optimizer and callbacks), is diagnosed once (`tfaccel.doctor.diagnose(model,
train)`, the doctor's default budget unless `--budget`); the report's first fix
(`report.fixes[0]`) is then applied the way a user would: its `code` (the Keras statement
for a `model.fit` script) executed on `model` after a fresh build and compile, or before
the build where it sets the global dtype policy (the action says "before the model is
built"); an input fix on the recipe's dataset (`.prefetch`, or the doctor's own parallel
maps); a fix naming a batch (`batch=N`) by rebuilding the inputs at that batch. A fix that
cannot be applied automatically (no code, no batch, no dataset change; "no software fix")
is recorded with the reason and not run.

Time to target: wall seconds from just before the build (the policy, build, compile, fix,
tracing and each epoch's held-out evaluation included) to the end of the first epoch whose
held-out accuracy reaches the job's fixed target, as `time_to_accuracy_heldout.py` measures
it (its `Curve`); a run cut at `--cap` seconds, or one that fails, never reaches it and
counts as infinitely slow. Runs are paired by seed and interleaved (seed 0 without, seed 0
with, seed 1 without, ...). The ratio is time without ÷ time with (≥ 1: the fix paid), as
each seed's and their median with a bootstrap 90 % interval. The doctor's own cost (one
diagnosis per job) is not in those times: it is reported apart, and again added to each
"with" run (`ratio_with_doctor`).

Run: `python benchmarks/doctor_heldout.py [--jobs ...] [--seeds 3] [--cap 120]
[--budget S] [--host "..."] [--toy] [--json F]`; writes
`benchmarks/results/doctor_heldout.json` (not with `--toy`; `--json F` writes any run to F).
`tests/test_doctor_heldout.py` runs `--toy` on the table job.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any

import heldout_jobs
import keras
import numpy as np
import tensorflow as tf
from time_to_accuracy import epochs_to, time_to
from time_to_accuracy_heldout import Curve, _code, _interval, _ratio

import tfaccel
from tfaccel.doctor import variants

OUT = pathlib.Path(__file__).parent / "results" / "doctor_heldout.json"
COUNTED = (
    "separately: `ratio` compares the runs alone; `ratio_with_doctor` adds the job's one "
    "diagnosis (doctor_cost_s) to each run with the fix"
)


@dataclasses.dataclass
class Applied:
    """How a fix is applied: code before the build / after the compile, a dataset change,
    a new batch; or why it is not (`skipped`)."""

    how: str = ""
    before_build: str | None = None
    after_compile: str | None = None
    dataset: Callable[[Any], Any] | None = None
    batch: int | None = None
    skipped: str | None = None


def plan(fix) -> Applied:
    """The way a user would apply `fix` to a model.fit script, or why it cannot be."""
    if fix is None:
        return Applied(skipped="the report lists no fix")
    if not fix.software:
        return Applied(skipped=f"no software fix: {fix.action}")
    if fix.code and "set_global_policy" in fix.code:
        return Applied(how=f"before the build: {fix.code}", before_build=fix.code)
    if fix.code and fix.code.startswith("trainer ="):
        return Applied(skipped=f"a port to the Trainer ({fix.code}), not a model.fit change")
    if fix.code:
        return Applied(how=f"after compile: {fix.code}", after_compile=fix.code)
    batch = re.search(r"batch(?:_size)?\s*=\s*(\d+)", fix.action)
    if batch:
        return Applied(how=f"the inputs rebuilt at batch {batch[1]}", batch=int(batch[1]))
    if "prefetch(" in fix.action:
        return Applied(how="train.prefetch(tf.data.AUTOTUNE)", dataset=_prefetch)
    if "num_parallel_calls" in fix.action:
        return Applied(how="the doctor's parallel maps (variants.parallel_maps)", dataset=_maps)
    return Applied(
        skipped=f"no code, batch or dataset change to apply automatically: {fix.action!r}"
        + (f" ({fix.condition})" if fix.condition else "")
    )


def _prefetch(train):
    return train.prefetch(tf.data.AUTOTUNE)


def _maps(train):
    changed = variants.parallel_maps(train)
    if changed is None:
        raise ValueError("the pipeline has no sequential map to parallelize")
    return changed


def toy_job(job: heldout_jobs.HeldOutJob, parts: heldout_jobs.Parts):
    """A tiny slice of the job (a test's): 256 training rows, 128 held out, one epoch,
    a target of 0 (every run stops after its first epoch)."""
    xt, xv, yt, yv = parts
    recipe = dataclasses.replace(job.recipe, epochs=1)
    small = dataclasses.replace(job, recipe=recipe, target=0.0)
    return small, (xt[:256], xv[:128], yt[:256], yv[:128])


def compiled(job, parts, seed: int, recipe=None):
    """(model, train, val, callbacks): the job's model built and compiled as the job does."""
    recipe = recipe or job.recipe
    train, val, optimizer, callbacks = recipe.inputs(parts, seed)
    model = job.build()
    model.compile(optimizer=optimizer, loss=job.loss, metrics=["accuracy"])
    return model, train, val, callbacks


def diagnose(job, parts, budget: float | None, rounds: int) -> tuple[Any, float]:
    """The doctor on the job's compiled model and training data (seed 0): report, seconds."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    model, train, _, _ = compiled(job, parts, 0)
    start = time.perf_counter()
    try:
        report = tfaccel.doctor.diagnose(model, train, budget_s=budget, rounds=rounds)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return report, time.perf_counter() - start


def run(job, parts, seed: int, cap: float, applied: Applied | None = None) -> dict:
    """Trains the job's recipe (with `applied`, the fix); its curve and what the model ran."""
    keras.mixed_precision.set_global_policy("float32")  # no policy leaks between runs
    keras.utils.set_random_seed(seed)
    applied = applied or Applied()
    recipe = job.recipe
    if applied.batch:
        recipe = dataclasses.replace(recipe, batch=applied.batch)
    gc.collect()  # the previous run's garbage, collected outside every run's clock
    start = time.perf_counter()
    curve, model = Curve(start, job.target, cap), None
    try:
        if applied.before_build:
            exec(applied.before_build, {"keras": keras, "tf": tf, "tfaccel": tfaccel})
        model, train, val, callbacks = compiled(job, parts, seed, recipe)
        if applied.after_compile:
            scope = {"model": model, "keras": keras, "tf": tf, "tfaccel": tfaccel}
            exec(applied.after_compile, scope)
        if applied.dataset:
            train = applied.dataset(train)
        model.fit(
            train,
            epochs=recipe.epochs,
            validation_data=val,
            callbacks=[*callbacks, curve],
            verbose=0,
        )
    except Exception as error:  # noqa: BLE001 - a run's failure is a result
        return {"error": f"{type(error).__name__}: {error}"[:400], "curve": curve.points}
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return {
        "curve": curve.points,
        "batch": recipe.batch,
        "dtype_policy": model.dtype_policy.name,
        "steps_per_execution": int(model.steps_per_execution),
        "jit_compile": bool(model.jit_compile),
    }


def first_fix(report) -> dict | None:
    """The report's first fix, as the JSON records it."""
    if not report.fixes:
        return None
    fix = report.fixes[0]
    keys = ("stage", "action", "gain", "numerics", "outcome", "adopted", "code", "condition")
    return {k: getattr(fix, k) for k in keys} | {"software": fix.software}


def seconds(job, result: dict | None) -> float:
    if result is None or "error" in result:
        return math.inf
    return time_to(result["curve"], job.target)


def summarize(job, entry: dict, seeds: list[int], rng) -> dict:
    """Per seed: the times without and with, epochs, the ratios; their medians, intervals."""
    runs = entry["runs"]
    without = [seconds(job, runs[s]["without"]) for s in seeds]
    out = {
        "seconds_without": without,
        "epochs_without": [epochs_to(runs[s]["without"]["curve"], job.target) for s in seeds],
    }
    if entry["applied"].get("skipped"):
        return out
    with_ = [seconds(job, runs[s]["with"]) for s in seeds]
    cost = entry["doctor_cost_s"]
    ratios = [_ratio(a, b) for a, b in zip(without, with_, strict=True)]
    counted = [_ratio(a, b + cost) for a, b in zip(without, with_, strict=True)]
    return out | {
        "seconds_with": with_,
        "epochs_with": [epochs_to(runs[s]["with"]["curve"], job.target) for s in seeds],
        "ratio": _interval(ratios, rng),
        "ratio_with_doctor": _interval(counted, rng),
        "paid": sum(r >= 1.0 for r in ratios),
    }


def run_job(name: str, args, seeds: list[int]) -> dict:
    """Diagnoses one job, plans its first fix, and runs the seeds interleaved."""
    job = heldout_jobs.JOBS[name]
    parts = job.data()
    if args.toy:
        job, parts = toy_job(job, parts)
    report, cost = diagnose(job, parts, args.budget, args.rounds)
    fix = report.fixes[0] if report.fixes else None
    applied = plan(fix)
    entry: dict = {
        "target": job.target,
        "verdict": report.verdict,
        "first_fix": first_fix(report),
        "applied": {"how": applied.how, "skipped": applied.skipped},
        "doctor_cost_s": cost,
        "doctor_budget_s": report.budget_s,
        "runs": {},
        "report": report.to_dict(),
        "text": str(report),
    }
    print(f"== {name}: verdict {report.verdict}, first fix {entry['first_fix']}", flush=True)
    print(f"   doctor {cost:.1f} s; applied: {applied.how or applied.skipped}", flush=True)
    for seed in seeds:  # interleaved by seed: the machine's drift touches both alike
        pair = {"without": run(job, parts, seed, args.cap)}
        if not applied.skipped:
            pair["with"] = run(job, parts, seed, args.cap, applied)
        for side, result in pair.items():
            result.update(load_average=os.getloadavg())
            print(
                f"   seed {seed} {side}: {seconds(job, result):.1f} s, "
                f"{len(result['curve'])} epochs {result.get('error', '')[:160]}",
                flush=True,
            )
        entry["runs"][seed] = pair
    return entry | summarize(job, entry, seeds, np.random.default_rng(0))


def show(jobs: dict) -> str:
    """Markdown: a row per job: the first fix, how applied, ratio, seconds, doctor cost."""

    def x(v: float) -> str:
        return "—" if math.isnan(v) else "∞" if not math.isfinite(v) else f"{v:.2f}"

    def span(r: dict | None) -> str:
        return f"{x(r['median'])} [{x(r['low'])}, {x(r['high'])}]" if r else "not run"

    lines = [
        "| job | first fix (predicted) | applied | without ÷ with | with the doctor's cost "
        "| seconds without; with (median) | doctor s |",
        "|" + " --- |" * 7,
    ]
    for name, e in jobs.items():
        fix = e["first_fix"] or {}
        gain = f" ({x(fix['gain'])}x)" if fix.get("gain") is not None else ""
        with_ = e.get("seconds_with")
        times = f"{x(float(np.median(e['seconds_without'])))}; " + (
            x(float(np.median(with_))) if with_ else "—"
        )
        cells = [name, f"{fix.get('action', 'none')}{gain}", e["applied"]["how"] or "skipped"]
        cells += [span(e.get("ratio")), span(e.get("ratio_with_doctor")), times]
        cells.append(f"{e['doctor_cost_s']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", nargs="*", default=list(heldout_jobs.JOBS), choices=list(heldout_jobs.JOBS)
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cap", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--budget", type=float, default=None, help="diagnosis budget, s")
    parser.add_argument("--rounds", type=int, default=3, help="the doctor's rounds")
    parser.add_argument("--toy", action="store_true", help="tiny sizes (the test)")
    parser.add_argument("--json", help="also write the results to this file (any size)")
    parser.add_argument("--host", default="2 CPU cores shared with other work (a busy host)")
    args = parser.parse_args(argv)
    if args.toy:
        args.budget, args.rounds = args.budget or 2.0, 1
    seeds, began, code = list(range(args.seeds)), time.perf_counter(), _code()
    jobs = {name: run_job(name, args, seeds) for name in args.jobs}
    meta = {
        "host": f"{os.cpu_count()} CPU cores; {args.host}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": code,
        "seeds": seeds,
        "cap_seconds": args.cap,
        "doctor_budget_s": args.budget,
        "doctor_cost_counted": COUNTED,
        "toy": args.toy,
        "wall_seconds": time.perf_counter() - began,
        "load_average_1_5_15_at_the_end": list(os.getloadavg()),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    document = {"meta": meta, "jobs": jobs}
    text = json.dumps(document, indent=1, default=str)
    if args.json:
        pathlib.Path(args.json).write_text(text)
    if not args.toy:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(text)
    print(show(jobs))
    return document


if __name__ == "__main__":
    main()
